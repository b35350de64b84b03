// A flat file of little-endian uint16 token ids (the nanoGPT / llm.c ".bin" body), memory-mapped
// read-only: the corpus never has to fit in RAM.
#pragma once
#include <cstdint>
#include <string>

namespace syncopate {

class TokenFile {
 public:
  // Maps `path`; throws syncopate::Error if it cannot be opened, has an odd size, or holds fewer
  // than `min_tokens` tokens.
  TokenFile(const std::string& path, int64_t min_tokens);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return n_; }  // tokens
  const uint16_t* data() const { return data_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint16_t* data_ = nullptr;
  int64_t n_ = 0;
  size_t bytes_ = 0;
};

// Writes tokens as uint16 atomically; throws if an id does not fit.
void write_token_file(const std::string& path, const int64_t* ids, int64_t n);

}  // namespace syncopate
