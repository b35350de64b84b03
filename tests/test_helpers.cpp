#include "tests/test_helpers.h"

#include "common/check.h"
#include "common/comm/transport/memory_connection.h"

#include <cstdlib>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <future>
#include <fstream>
#include <random>

namespace syncopate::test {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / ("syncopate-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string write_tiny_corpus(const TempDir& dir, size_t bytes) {
  const std::string path = dir.str("corpus.txt");
  std::ofstream f(path, std::ios::binary);
  const char* lines[] = {"the quick brown fox jumps over the lazy dog.\n", "def add(a, b):\n    return a + b\n",
                         "a stitch in time saves nine.\n", "for i in range(10):\n    print(i)\n"};
  size_t n = 0;
  for (size_t i = 0; n < bytes; ++i) {
    std::string l = lines[(i * 7 + i / 3) % 4];
    f << l;
    n += l.size();
  }
  return path;
}

RunConfig tiny_run_config(const TempDir& dir) {
  RunConfig c;
  c.model.preset = "tiny";
  c.model.n_layer = 2;
  c.model.n_embd = 32;
  c.model.n_head = 2;
  c.model.block_size = 32;
  c.data.corpus = write_tiny_corpus(dir);
  c.data.cache_dir = dir.str("cache");
  c.train.steps = 6;
  c.train.batch_size = 4;
  c.train.threads = 1;
  c.schedule.warmup_steps = 2;
  c.eval.every = 0;
  c.eval.batches = 2;
  c.eval.sample_every = 0;
  c.eval.sample_tokens = 8;
  c.checkpoint.every = 0;
  return c;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

CommandResult run_command(const std::string& cmd) {
  CommandResult r{-1, ""};
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace syncopate::test

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <fcntl.h>
#include <sstream>
#include <thread>

extern char** environ;

namespace syncopate::test {

Process::Process(const std::vector<std::string>& argv, const std::vector<std::string>& env_add, const std::string& log) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& e : env_add) env.push_back(e);
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> a, en;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    for (auto& s : env) en.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    en.push_back(nullptr);
    ::execve(a[0], a.data(), en.data());
    ::_exit(127);
  }
}

Process::~Process() {
  if (!reaped_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

int Process::wait(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!reaped_) {
    int r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -2;
}

void Process::kill_hard() {
  if (!reaped_) ::kill(pid_, SIGKILL);
}

void run_memory_ring(int world, const std::function<void(int, Connection&, Connection&)>& fn) {
  std::vector<std::unique_ptr<Connection>> send_end(world), recv_end(world);
  for (int r = 0; r < world; ++r) {
    auto [s, rcv] = memory_channel(64 << 10, fmt::format("channel {}->{}", r, (r + 1) % world));
    send_end[r] = std::move(s);
    recv_end[(r + 1) % world] = std::move(rcv);
  }
  std::vector<std::future<void>> fs;
  for (int r = 0; r < world; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] { fn(r, *send_end[r], *recv_end[r]); }));
  for (auto& f : fs) f.get();
}

std::vector<Ring> tcp_ring(int world, const std::vector<std::string>& fingerprints, double timeout,
                           const std::vector<int>& streams, int lanes, double latency_s) {
  std::promise<uint16_t> port;
  auto port_f = port.get_future().share();
  std::vector<std::future<Ring>> fs;
  for (int r = 0; r < world; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      RendezvousOptions o;
      o.master_port = r == 0 ? 0 : port_f.get();
      o.nnodes = world;
      o.node_rank = r;
      o.token = "test-job";
      o.fingerprint = fingerprints.empty() ? "same" : fingerprints[r];
      o.timeout_s = timeout;
      o.streams = streams.empty() ? 1 : streams[r];
      o.lanes = lanes;
      o.latency_s = latency_s;
      if (r == 0) o.on_listening = [&](uint16_t p) { port.set_value(p); };
      return connect_ring(o);
    }));
  std::vector<Ring> rings;
  for (auto& f : fs) rings.push_back(f.get());
  return rings;
}

std::vector<std::string> rendezvous_args(const TempDir& d) {
  static std::atomic<int> n{0};
  return {"--dist.master_port=-1", "--dist.rendezvous_file=" + d.str("rendezvous" + std::to_string(n++))};
}

ServerPort any_server_port(const TempDir& d) {
  static std::atomic<int> n{0};
  const std::string file = d.str("endpoint" + std::to_string(n++));
  return {{"--server.port=-1", "--server.endpoint_file=" + file}, file};
}

std::string wait_for_line(const std::string& path, double timeout_s, Process* p) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const std::string text = slurp(path);
    if (const size_t nl = text.find('\n'); nl != std::string::npos) return text.substr(0, nl);
    SYN_CHECK(!p || p->wait(0) == -1, fmt::format("the process exited before writing '{}'", path), "see its log");
    SYN_CHECK(std::chrono::steady_clock::now() < deadline, fmt::format("'{}' did not appear within {} s", path, timeout_s),
              "the process is slow or stuck: see its log");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool wait_for_step(const std::string& out, int64_t step, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::istringstream lines(slurp(out + "/metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {  // a line still being written does not parse: skipped
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"] == step) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string bin_dir() {
  const char* v = std::getenv("SYNCOPATE_TEST_BIN");
  return v && *v ? v : SYNCOPATE_BIN_DIR;
}

}  // namespace syncopate::test
