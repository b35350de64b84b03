#include "common/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/check.h"

namespace syncopate {

MappedFile::MappedFile(const std::string& path, const std::string& hint) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SYN_CHECK(fd >= 0, fmt::format("cannot open '{}': {}", path, std::strerror(errno)), hint);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    SYN_FAIL(fmt::format("'{}' is not a regular file", path), hint);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    SYN_CHECK(p != MAP_FAILED, fmt::format("cannot map '{}' ({} bytes): {}", path, size_, std::strerror(err)),
              "check the address-space limit (ulimit -v)");
    ::madvise(p, size_, MADV_RANDOM);  // windows are sampled at random offsets
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace syncopate
