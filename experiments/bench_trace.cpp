// Cost of one timeline event, for docs/PERFORMANCE.md: a span recorded into a trace file
// (format + buffer + the file's 64 KiB writes) from 1 and 2 threads, and a span with tracing off.
// Multiplied by the events per step of a run (scripts/bench_trace.sh counts them) it bounds what
// tracing adds to a step, far below what step-time A/B runs on a shared machine can resolve.
//   syncopate-bench-trace [EVENTS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/trace.h"

using namespace syncopate;
using Clock = std::chrono::steady_clock;

static double ns_per(int64_t n, Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 2'000'000;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) TraceSpan s("step", "train");
  const double off = ns_per(n, t0);
  const std::string path = fmt::format("/tmp/syncopate-bench-trace-{}.json", ::getpid());
  double on1 = 0, on2 = 0, args = 0;
  {
    TraceSession session(path, "bench");
    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) TraceSpan s("step", "train");
    on1 = ns_per(n, t0);
    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i)
      Tracer::global().complete("reduce region", "comm", i, i + 5, -1, fmt::format(R"("region":{},"bytes":{})", i & 7, 4096));
    args = ns_per(n, t0);
    t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int k = 0; k < 2; ++k)
      ts.emplace_back([n] {
        for (int64_t i = 0; i < n / 2; ++i) TraceSpan s("forward", "train");
      });
    for (auto& t : ts) t.join();
    on2 = ns_per(n, t0);
  }
  std::remove(path.c_str());
  std::printf("span, tracing off:            %8.1f ns\n", off);
  std::printf("span, tracing on (1 thread):  %8.1f ns\n", on1);
  std::printf("event with args (1 thread):   %8.1f ns\n", args);
  std::printf("span, tracing on (2 threads): %8.1f ns per event (wall / events)\n", on2);
  return 0;
}
