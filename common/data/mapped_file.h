// A whole file memory-mapped read-only (RAII): corpora are read in place, never loaded into RAM.
#pragma once
#include <cstddef>
#include <string>

namespace syncopate {

class MappedFile {
 public:
  // Throws syncopate::Error naming the path when it cannot be opened or mapped; `hint` says what
  // the user should check.
  MappedFile(const std::string& path, const std::string& hint);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace syncopate
