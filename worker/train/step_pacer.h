// Paces each optimizer step to its modelled compute time (see EmulateConfig). The training loop
// calls begin() when a step starts and end_compute() when its forward and backward are done;
// end_compute() sleeps (never spins) until the step's modelled time has passed since begin(). A
// pacer of a config without emulation only measures: the loop has no branch for it.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

#include "worker/train/emulate_config.h"

namespace syncopate {

struct StepTiming {
  double compute_s = 0;   // real time from begin() to end_compute(), before any sleep
  double modelled_s = 0;  // the step's modelled compute time (0 without emulation)
  bool overrun = false;   // real compute exceeded the modelled time: the emulation did not hold for this step
};

class StepPacer {
 public:
  // seed and node pick the jitter stream: the same (seed, node, step) always gives the same time.
  StepPacer(const EmulateConfig& cfg, uint64_t seed, int64_t node);
  // The modelled compute time of `step` on this node: base * slowdown * (1 + jitter draw); 0 when off.
  double modelled_s(int64_t step) const;
  void begin(int64_t step);
  StepTiming end_compute();
  // emulate.overlap: blocks (any thread) until the modelled backward of the current step's last
  // micro-batch (of micro_batches, each a forward and a backward of equal length) has produced the
  // share `backward_done` (0..1, counted from the last parameter) of the gradient, i.e. until
  // begin + modelled * (micro_batches - 1 + forward_share + (1 - forward_share) * backward_done) / micro_batches.
  // Returns at once without overlap or emulation, or when that moment has passed.
  void wait_until_produced(double backward_done, int64_t micro_batches = 1) const;
  // That moment as a share of the modelled step (the rule above; for tests and the benchmark).
  double produced_share(double backward_done, int64_t micro_batches = 1) const;

 private:
  using Clock = std::chrono::steady_clock;
  EmulateConfig cfg_;
  uint64_t stream_;
  int64_t step_ = 0;
  Clock::time_point start_{};
  std::atomic<int64_t> start_ns_{0};     // start_, for other threads (wait_until_produced)
  std::atomic<double> step_modelled_{0};  // the current step's modelled time
};

}  // namespace syncopate
