// A tokenizer turns text into token ids and back. Two kinds: "byte" (token = byte value,
// end-of-document = 256) and "gpt2-bpe" (GPT-2's byte-level BPE from vocab.json + merges.txt,
// the ids Hugging Face's GPT2TokenizerFast gives on the same files).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace syncopate {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the ids of `text` to `out`. Throws syncopate::Error when the tokenizer cannot encode
  // the text (GPT-2 BPE: invalid UTF-8, naming the byte offset). Safe to call from many threads.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // The text of `ids`; ids outside the vocabulary decode to nothing.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // every id is < vocab_size()
  virtual int64_t eod() const = 0;         // end-of-document id, or -1 if the vocabulary has none
  virtual std::string name() const = 0;    // "byte" or "gpt2-bpe"
  // Identifies the vocabulary (and so the meaning of the ids), for caches and checkpoints.
  virtual uint64_t fingerprint() const = 0;

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }
};

// Where a tokenizer comes from: one config struct, shared by syncopate-data and the trainer.
struct TokenizerConfig {
  // "byte" or "gpt2-bpe" (Megatron-LM's name "GPT2BPETokenizer" and "ByteTokenizer" are accepted).
  std::string type = "byte";
  std::string vocab_file = "";  // gpt2-bpe: vocab.json (token string -> id)
  std::string merge_file = "";  // gpt2-bpe: merges.txt (one "left right" merge per line, by rank)
};

// Builds the tokenizer; throws syncopate::Error naming the bad file, line and what to do.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& config);

}  // namespace syncopate
