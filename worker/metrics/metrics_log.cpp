#include "worker/metrics/metrics_log.h"

#include <fstream>

#include <unistd.h>

#include <chrono>
#include <iostream>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/check.h"

namespace syncopate {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

MetricsLog::MetricsLog(const std::string& path, int64_t resume_step) {
  std::string kept;
  if (resume_step >= 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      try {
        if (nlohmann::json::parse(line).value("step", int64_t{0}) <= resume_step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {  // a line cut short by the crash
      }
    }
  }
  write_file_atomic(path, kept);
  f_ = std::fopen(path.c_str(), "a");
  SYN_CHECK(f_, fmt::format("cannot open metrics file '{}'", path), "check that --out is writable");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& r) {
  std::string s = r.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);
}

Progress::Progress(int64_t total, int64_t log_every)
    : total_(total), log_every_(log_every), t0_(now_seconds()), tty_(::isatty(STDOUT_FILENO)) {}

void Progress::step(int64_t step, double loss, double lr, double tok_s) {
  if (first_step_ < 0) first_step_ = step - 1, t0_ = now_seconds();
  const double el = now_seconds() - t0_;
  const double rate = (step - first_step_) / std::max(el, 1e-9);
  const double eta = (total_ - step) / std::max(rate, 1e-9);
  const std::string stats = fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | eta {:.0f}s",
                                        step, total_, loss, lr, tok_s, eta);
  if (tty_) {
    const int width = 24;
    const int filled = static_cast<int>(width * step / std::max<int64_t>(1, total_));
    std::cout << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << stats << "\033[K"
              << std::flush;
    bar_drawn_ = true;
  } else if (step % log_every_ == 0 || step == total_ || step == first_step_ + 1) {
    std::cout << stats << std::endl;
  }
}

void Progress::line(const std::string& text) {
  if (bar_drawn_) std::cout << "\r\033[K";
  std::cout << text << std::endl;
  bar_drawn_ = false;
}

void Progress::finish() {
  if (bar_drawn_) std::cout << std::endl;
  bar_drawn_ = false;
}

}  // namespace syncopate
