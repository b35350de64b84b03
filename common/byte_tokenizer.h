// Byte-level tokenizer: token = byte value (0..255), end-of-document = 256. Lossless on any bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace syncopate {

struct ByteTokenizer {
  static constexpr int64_t kEod = 256;
  static constexpr int64_t kVocab = 257;
  static std::vector<int64_t> encode(const std::string& text) {
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  // Ids outside 0..255 (end-of-document, padding) decode to nothing.
  static std::string decode(const std::vector<int64_t>& ids) {
    std::string s;
    for (auto id : ids)
      if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
    return s;
  }
};

}  // namespace syncopate
