// Shared test utilities: temporary directories, tiny configs, running the real binaries.
#pragma once
#include <cstdio>
#include <filesystem>
#include <string>

#include "worker/run_config.h"

namespace syncopate::test {

// A fresh empty directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& child = "") const { return (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

// Writes a small text corpus (a few hundred KB of repetitive text) into dir/corpus.txt.
std::string write_tiny_corpus(const TempDir& dir, size_t bytes = 200000);

// A config that trains in well under a second per step on one CPU core.
RunConfig tiny_run_config(const TempDir& dir);

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};
// Runs a shell command and captures its output.
CommandResult run_command(const std::string& cmd);

}  // namespace syncopate::test
