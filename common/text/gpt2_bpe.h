// GPT-2's byte-level BPE (Radford et al. 2019), exactly as Hugging Face's GPT2TokenizerFast:
//  1. split the text with GPT-2's pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//  2. map each piece's UTF-8 bytes to printable characters (bytes_to_unicode),
//  3. merge adjacent symbols, lowest merge rank first, leftmost first among equal ranks.
// Special tokens in the text ("<|endoftext|>") are not treated specially: text is text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/text/tokenizer.h"

namespace syncopate {

class Gpt2Bpe final : public Tokenizer {
 public:
  // Reads vocab.json and merges.txt; throws syncopate::Error with file, line and a hint when either
  // is missing, malformed, lacks a byte symbol, or names a token the vocabulary does not have.
  Gpt2Bpe(const std::string& vocab_file, const std::string& merge_file);

  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  using Tokenizer::encode;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(token_bytes_.size()); }
  int64_t eod() const override { return eod_; }
  std::string name() const override { return "gpt2-bpe"; }
  uint64_t fingerprint() const override { return fingerprint_; }
  size_t merges() const { return merge_.size(); }

  // Calls emit(begin, end) with the byte ranges of GPT-2's pre-tokens of `text` (valid UTF-8).
  template <class F>
  static void pretokenize(std::string_view text, F&& emit);

 private:
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> token_bytes_;            // id -> the bytes it stands for
  int32_t byte_id_[256];                            // id of each single byte's symbol
  std::unordered_map<uint64_t, uint64_t> merge_;    // (left << 32 | right) -> (rank << 32 | merged id)
  int64_t eod_ = -1;
  uint64_t fingerprint_ = 0;
  uint64_t instance_ = 0;  // unique per object, never reused: keys the per-thread piece cache
};

}  // namespace syncopate

#include "common/text/gpt2_pretokenize.inl"
