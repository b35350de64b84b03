#include "worker/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/atomic_file.h"
#include "common/check.h"

namespace syncopate {

TokenFile::TokenFile(const std::string& path, int64_t min_tokens) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SYN_CHECK(fd >= 0, fmt::format("cannot open token file '{}': {}", path, std::strerror(errno)),
            "check data.train_file / data.val_file, or delete the data cache to rebuild it");
  struct stat st {};
  ::fstat(fd, &st);
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ % 2 != 0 || static_cast<int64_t>(bytes_ / 2) < min_tokens) {
    ::close(fd);
    SYN_FAIL(fmt::format("token file '{}' holds {} bytes: {}", path, bytes_,
                         bytes_ % 2 ? "not a whole number of uint16 tokens"
                                    : fmt::format("fewer than one window of {} tokens", min_tokens)),
             "use a larger corpus or a shorter model.block_size");
  }
  n_ = static_cast<int64_t>(bytes_ / 2);
  void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  SYN_CHECK(p != MAP_FAILED, fmt::format("mmap '{}' failed: {}", path, std::strerror(errno)), "check memory limits");
  data_ = static_cast<const uint16_t*>(p);
}

TokenFile::~TokenFile() {
  if (data_) ::munmap(const_cast<uint16_t*>(data_), bytes_);
}

void write_token_file(const std::string& path, const int64_t* ids, int64_t n) {
  std::vector<uint16_t> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    SYN_CHECK(ids[i] >= 0 && ids[i] < 65536, fmt::format("token id {} does not fit in uint16", ids[i]),
              "vocabularies above 65536 need the indexed dataset format");
    buf[static_cast<size_t>(i)] = static_cast<uint16_t>(ids[i]);
  }
  AtomicFile f(path);
  f.write(buf.data(), buf.size() * sizeof(uint16_t));
  f.commit();
}

}  // namespace syncopate
