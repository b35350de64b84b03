// Run output for people and programs: JSON Lines metrics (<out>/metrics.jsonl, one object per
// line, flushed per line) and a progress display (a redrawn bar on a terminal, plain lines
// every log_every steps otherwise).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace syncopate {

class MetricsLog {
 public:
  // resume_step >= 0 keeps the earlier lines of steps up to resume_step (a resumed run; lines of
  // later steps, from a run that got further before it died, are dropped); -1 starts afresh.
  MetricsLog(const std::string& path, int64_t resume_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
};

class Progress {
 public:
  Progress(int64_t total_steps, int64_t log_every);
  // Step counts completed optimizer steps; eta from the measured rate since construction.
  void step(int64_t step, double loss, double lr, double tokens_per_s);
  // A line that must not be overwritten by the bar (evaluation results, samples).
  void line(const std::string& text);
  void finish();

 private:
  int64_t total_, log_every_, first_step_ = -1;
  double t0_ = 0;
  bool tty_;
  bool bar_drawn_ = false;
};

double now_seconds();   // monotonic clock, seconds
double unix_seconds();  // wall clock, seconds since the Unix epoch (aligns the nodes of one machine)

}  // namespace syncopate
