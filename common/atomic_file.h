// Crash-safe file writes: data goes to "<path>.tmp.<pid>", is fsync'ed, then renamed over
// <path> and the directory fsync'ed. A reader sees the old file or the new one, never a torn one.
#pragma once
#include <cstddef>
#include <string>

namespace syncopate {

// RAII writer. Destroying it without commit() removes the temporary file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  void commit();  // fsync, rename into place, fsync the directory

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// Writes a whole file atomically.
void write_file_atomic(const std::string& path, const std::string& contents);
// Publishes a small signal file (a port, an endpoint) whole or not at all: written beside it and
// renamed over it, without fsync and outside the crash points (it is a readiness signal, not data).
void publish_file(const std::string& path, const std::string& contents);
// fsyncs a directory so that renames inside it are durable.
void fsync_dir(const std::string& dir);
// Removes the temporary files that writers of `path` killed before commit() left behind
// ("<path>.tmp.*"); returns how many. Call it where one process owns `path`, before writing it.
int remove_temp_files(const std::string& path);
// Reads a whole file; throws syncopate::Error naming the path if it cannot.
std::string read_file(const std::string& path);

}  // namespace syncopate
