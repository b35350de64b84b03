// Byte-level tokenizer: token = byte value (0..255), end-of-document = 256. Lossless on any
// bytes, needs no vocabulary file.
#pragma once
#include "common/text/tokenizer.h"

namespace syncopate {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int64_t kEod = 256;
  static constexpr int64_t kVocab = 257;

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  using Tokenizer::encode;
  // Ids outside 0..255 (end-of-document, padding) decode to nothing.
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string s;
    for (auto id : ids)
      if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
    return s;
  }
  int64_t vocab_size() const override { return kVocab; }
  int64_t eod() const override { return kEod; }
  std::string name() const override { return "byte"; }
  uint64_t fingerprint() const override { return 0x62797465ULL; }  // "byte"
};

}  // namespace syncopate
