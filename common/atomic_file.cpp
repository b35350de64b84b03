#include "common/atomic_file.h"

#include <atomic>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/check.h"
#include "common/crash_point.h"

namespace syncopate {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // pid + a per-process counter: writers in different processes or threads never share a temp file.
  static std::atomic<uint64_t> counter{0};
  tmp_ = fmt::format("{}.tmp.{}.{}", path_, ::getpid(), counter.fetch_add(1));
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SYN_CHECK(fd_ >= 0, fmt::format("cannot create '{}': {}", tmp_, std::strerror(errno)),
            "check that the directory exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    SYN_CHECK(w > 0, fmt::format("write to '{}' failed: {}", tmp_, std::strerror(errno)),
              "check free disk space");
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  // Recovery tests: a kill before the rename of the process's n-th commit. Counted over all of its
  // threads: where background writers commit beside the request or training thread (a shard's journal
  // and reserve records beside its snapshots), n depends on their interleaving, so a test that names a
  // commit runs one writer (helper-18).
  static std::atomic<int64_t> commits{0};
  crash_point("atomic_file", "commit", ++commits);
  SYN_CHECK(::fsync(fd_) == 0, fmt::format("fsync '{}' failed: {}", tmp_, std::strerror(errno)), "check the disk");
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp_.c_str());
    SYN_FAIL(fmt::format("rename '{}' -> '{}' failed: {}", tmp_, path_, std::strerror(e)), "check permissions");
  }
  auto parent = std::filesystem::path(path_).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

void publish_file(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << contents;
    SYN_CHECK(f.good(), fmt::format("cannot write '{}'", tmp), "check that its directory exists and is writable");
  }
  SYN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, fmt::format("cannot rename '{}' to '{}'", tmp, path),
            "check that its directory exists and is writable");
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SYN_CHECK(in.good(), fmt::format("cannot open '{}'", path), "check the path");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int remove_temp_files(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".tmp.";
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && e.is_regular_file(ec) && fs::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace syncopate
