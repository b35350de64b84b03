#include "worker/train/step_pacer.h"

#include "common/trace.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "common/check.h"
#include "common/splitmix64.h"

namespace syncopate {

void EmulateConfig::validate() const {
  SYN_CHECK(!(target_params > 0 && step_time_s > 0),
            fmt::format("emulate.step_time_s={} and emulate.target_params={} both set the modelled step time", step_time_s,
                        target_params),
            "set one: step_time_s directly, or target_params with target_tokens, peak_tflops, mfu and dilation");
  SYN_CHECK(target_params == 0 || target_tokens > 0,
            "emulate.target_params is set but emulate.target_tokens is 0",
            "set --emulate.target_tokens to the tokens one target node processes per step");
  SYN_CHECK(jitter_tail == 0 || jitter_tail > 1,
            fmt::format("emulate.jitter_tail={} has no finite mean", jitter_tail),
            "use 0 (exponential jitter) or a Lomax shape above 1 (1.5: heavy-tailed, finite mean)");
  SYN_CHECK(enabled() || (slowdown == 1.0 && jitter == 0.0),
            fmt::format("emulate.slowdown={} / emulate.jitter={} need a modelled step time", slowdown, jitter),
            "set --emulate.step_time_s (seconds per step at slowdown 1): the slowdown multiplies the modelled time, "
            "never the measured one");
  SYN_CHECK(base_step_s() < 3600.0, fmt::format("the modelled step time is {:.3g} s", base_step_s()),
            "lower emulate.dilation or target_tokens: at most one hour per step");
}

StepPacer::StepPacer(const EmulateConfig& cfg, uint64_t seed, int64_t node)
    : cfg_(cfg), stream_(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(node) + 0x5157ULL))) {}

double StepPacer::modelled_s(int64_t step) const {
  const double base = cfg_.base_step_s();
  if (base <= 0) return 0;
  double factor = 1.0;
  if (cfg_.jitter > 0) {
    // Uniform in (0, 1] from the top 53 bits of a hash of (stream, step), then an exponential draw.
    const uint64_t h = splitmix64(stream_ ^ splitmix64(static_cast<uint64_t>(step)));
    const double u = (static_cast<double>(h >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    // Exponential of mean `jitter`, or Lomax of shape a and scale jitter (a - 1) (the same mean):
    // inverse CDFs of u.
    const double a = cfg_.jitter_tail;
    factor += a > 0 ? cfg_.jitter * (a - 1) * (std::pow(u, -1.0 / a) - 1) : -std::log(u) * cfg_.jitter;
  }
  return base * (step >= cfg_.slowdown_from_step ? cfg_.slowdown : 1.0) * factor;
}

void StepPacer::begin(int64_t step) {
  step_ = step;
  start_ = Clock::now();
  step_modelled_.store(cfg_.overlap ? modelled_s(step) : 0.0);
  start_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(start_.time_since_epoch()).count());
}

double StepPacer::produced_share(double backward_done, int64_t micro_batches) const {
  const double k = static_cast<double>(std::max<int64_t>(1, micro_batches));
  return (k - 1 + cfg_.forward_share + (1.0 - cfg_.forward_share) * std::clamp(backward_done, 0.0, 1.0)) / k;
}

void StepPacer::wait_until_produced(double backward_done, int64_t micro_batches) const {
  const double modelled = step_modelled_.load();
  if (modelled <= 0) return;
  const double f = produced_share(backward_done, micro_batches);
  const Clock::time_point at = Clock::time_point(std::chrono::nanoseconds(start_ns_.load())) +
                               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(modelled * f));
  if (Clock::now() < at) {
    TraceSpan span("modelled backward (region not yet produced)", "emulate");
    std::this_thread::sleep_until(at);
  }
}

StepTiming StepPacer::end_compute() {
  StepTiming t;
  t.compute_s = std::chrono::duration<double>(Clock::now() - start_).count();
  t.modelled_s = modelled_s(step_);
  if (t.modelled_s <= 0) return t;
  t.overrun = t.compute_s > t.modelled_s;
  TraceSpan span("modelled compute (sleep)", "emulate");
  if (!t.overrun)
    std::this_thread::sleep_until(start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t.modelled_s)));
  return t;
}

}  // namespace syncopate
