// Shared test utilities: temporary directories, tiny configs, running the real binaries.
#pragma once
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/comm/rendezvous.h"
#include "worker/train/run_config.h"

namespace syncopate::test {

// Joins `world` threads into a TCP ring through the rendezvous on an ephemeral port (node r's
// fingerprint, streams per link; lanes rings over the same nodes; latency_s: every node's emulated
// one-way latency, RendezvousOptions::latency_s).
std::vector<Ring> tcp_ring(int world, const std::vector<std::string>& fingerprints = {}, double timeout = 20,
                           const std::vector<int>& streams = {}, int lanes = 1, double latency_s = 0);

// Runs fn(rank, next, prev) on `world` threads joined in a ring of in-memory channels.
void run_memory_ring(int world, const std::function<void(int, Connection&, Connection&)>& fn);

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

// Every line of a JSON Lines file (metrics.jsonl), parsed; blank lines skipped.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// Runs f and returns the message of the syncopate::Error it throws ("" if it throws none).
std::string error_of(const std::function<void()>& f);

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};
// Runs a shell command and captures its output.
CommandResult run_command(const std::string& cmd);

}  // namespace syncopate::test

namespace syncopate::test {

// A child process with its own environment additions; stdout+stderr go to log_path.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::vector<std::string>& env_add, const std::string& log_path);
  ~Process();  // kills the process if still running
  // Waits up to timeout_s; returns the exit code, or -1 if it is still running (or was killed by a signal: -2).
  int wait(double timeout_s);
  void kill_hard();  // SIGKILL
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
};

// Ring rendezvous on any free port: node 0 binds one and publishes it through a fresh file in d
// (--dist.master_port=-1 --dist.rendezvous_file=...); the other nodes wait for the file. No port
// is picked in advance, so nothing can take it in between.
std::vector<std::string> rendezvous_args(const TempDir& d);
// A parameter server on any free port: the arguments, and the file its endpoint appears in once it
// listens (--server.port=-1 --server.endpoint_file=...).
struct ServerPort {
  std::vector<std::string> args;
  std::string endpoint_file;
};
ServerPort any_server_port(const TempDir& d);
// Waits until `path` holds a complete line (a readiness file, written atomically) and returns it
// without the newline; throws syncopate::Error after timeout_s or when `p` exits first.
std::string wait_for_line(const std::string& path, double timeout_s, Process* p = nullptr);
// Waits until the metrics of a run (out/metrics.jsonl) have a record of `step`.
bool wait_for_step(const std::string& out, int64_t step, double timeout_s);
// A TCP port on 127.0.0.1 that was free a moment ago (bound and released): only for an endpoint
// where nothing should listen. Servers and rendezvous of tests pick their own ports (above).
int free_port();
// The directory of the worker and server binaries the tests start: the build's own, or
// $SYNCOPATE_TEST_BIN (scripts/asan_check.sh points it at AddressSanitizer builds).
std::string bin_dir();
// Reads a whole text file ("" if missing).
std::string slurp(const std::string& path);

}  // namespace syncopate::test
