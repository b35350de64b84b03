// StepPacer: a step lasts its modelled time (sleeping, never shortening real compute), overruns are
// recorded, jitter is reproducible per seed, and the emulation config refuses what it cannot model.
#include <cmath>
#include <algorithm>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "worker/train/emulate_config.h"
#include "worker/metrics/metrics_log.h"
#include "worker/train/step_pacer.h"

using namespace syncopate;

namespace {
void busy(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }
}  // namespace

// Tolerance: the step ends no earlier than its modelled time and at most 40 ms after it (a sleep's
// wake-up on a loaded 2-core machine; the emulated steps last 100s of ms).
TEST(StepPacer, HoldsAStepToItsModelledTime) {
  EmulateConfig c;
  c.step_time_s = 0.10;
  c.slowdown = 1.5;
  StepPacer p(c, 1, 0);
  for (int64_t step = 0; step < 3; ++step) {
    const double t0 = now_seconds();
    p.begin(step);
    busy(0.02);  // the real compute
    const StepTiming t = p.end_compute();
    const double took = now_seconds() - t0;
    EXPECT_DOUBLE_EQ(t.modelled_s, 0.15);
    EXPECT_FALSE(t.overrun);
    EXPECT_GE(t.compute_s, 0.02);
    EXPECT_LT(t.compute_s, 0.15);
    EXPECT_GE(took, 0.15);
    EXPECT_LT(took, 0.15 + 0.04);
  }
}

TEST(StepPacer, RecordsAnOverrunWhenComputeIsSlowerAndAddsNoSleep) {
  EmulateConfig c;
  c.step_time_s = 0.02;
  StepPacer p(c, 1, 0);
  const double t0 = now_seconds();
  p.begin(0);
  busy(0.06);
  const StepTiming t = p.end_compute();
  EXPECT_TRUE(t.overrun);
  EXPECT_GE(t.compute_s, 0.06);
  EXPECT_LT(now_seconds() - t0, 0.06 + 0.04);
}

TEST(StepPacer, WithoutEmulationOnlyMeasures) {
  StepPacer p(EmulateConfig{}, 1, 0);
  p.begin(0);
  busy(0.01);
  const StepTiming t = p.end_compute();
  EXPECT_EQ(t.modelled_s, 0.0);
  EXPECT_FALSE(t.overrun);
  EXPECT_GE(t.compute_s, 0.01);
}

TEST(StepPacer, JitterIsReproduciblePerSeedAndNodeAndHasTheConfiguredMean) {
  EmulateConfig c;
  c.step_time_s = 1.0;
  c.slowdown = 2.0;
  c.jitter = 0.25;
  StepPacer a(c, 7, 3), again(c, 7, 3), other_seed(c, 8, 3), other_node(c, 7, 4);
  double sum = 0;
  int same_seed = 0, diff_seed = 0, diff_node = 0;
  const int n = 20000;
  for (int64_t s = 0; s < n; ++s) {
    const double t = a.modelled_s(s);
    EXPECT_GE(t, 2.0);  // shifted: never below base * slowdown
    sum += t;
    same_seed += t == again.modelled_s(s);
    diff_seed += t == other_seed.modelled_s(s);
    diff_node += t == other_node.modelled_s(s);
  }
  EXPECT_EQ(same_seed, n);
  EXPECT_LT(diff_seed, n / 100);
  EXPECT_LT(diff_node, n / 100);
  // E[T] = base * slowdown * (1 + jitter) = 2.5; the mean of 20000 draws is within 2% (sd of the
  // mean: 2 * 0.25 / sqrt(20000) = 0.0035).
  EXPECT_NEAR(sum / n, 2.5, 0.05);
}

// Heavy-tailed jitter (emulate.jitter_tail = alpha): Lomax of shape alpha and the exponential's mean.
// Checked where a heavy tail differs from the exponential of the same mean: the median is lower
// (Lomax: lambda (2^(1/alpha) - 1) with lambda = jitter (alpha - 1); exponential: jitter ln 2) and
// steps past 10x the mean are far more frequent (Lomax: (1 + 10 / (alpha - 1))^-alpha = 1.04% at
// 1.5; exponential: e^-10 = 0.0045%).
TEST(StepPacer, HeavyTailedJitterHasTheMeanItsMedianAndItsTail) {
  EmulateConfig c;
  c.step_time_s = 1.0;
  c.jitter = 0.2;
  c.jitter_tail = 1.5;
  c.validate();
  EmulateConfig e = c;
  e.jitter_tail = 0;
  StepPacer heavy(c, 11, 0), expo(e, 11, 0);
  const int n = 200000;
  std::vector<double> h(n);
  int far_h = 0, far_e = 0;
  for (int64_t s = 0; s < n; ++s) {
    h[static_cast<size_t>(s)] = heavy.modelled_s(s) - 1.0;
    far_h += h[static_cast<size_t>(s)] > 10 * 0.2;
    far_e += expo.modelled_s(s) - 1.0 > 10 * 0.2;
    EXPECT_GE(h[static_cast<size_t>(s)], 0.0);
  }
  std::nth_element(h.begin(), h.begin() + n / 2, h.end());
  const double lambda = 0.2 * 0.5;
  EXPECT_NEAR(h[n / 2], lambda * (std::pow(2.0, 1 / 1.5) - 1), 0.003) << "the Lomax median";
  const double p_far = std::pow(1 + 2.0 / lambda, -1.5);  // 1.04%
  EXPECT_NEAR(far_h / double(n), p_far, 0.1 * p_far) << "the tail past 10x the mean";
  EXPECT_LT(far_e, 20) << "the exponential's tail there is ~100x thinner";
  c.jitter_tail = 0.8;  // no finite mean
  try {
    c.validate();
    ADD_FAILURE() << "accepted jitter_tail 0.8";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("emulate.jitter_tail"), std::string::npos) << err.what();
  }
}

// emulate.overlap (issue 25): a gradient region is released when the modelled backward has
// produced it: forward is forward_share of the (last micro-batch's share of the) step, then the
// gradient from the end of the flat buffer to its start. The release is never early (a lower
// bound, not a timing assertion), and without overlap nothing waits.
TEST(StepPacer, ReleasesGradientRegionsAtTheirModelledMoments) {
  EmulateConfig c;
  c.step_time_s = 0.3;
  c.overlap = true;
  StepPacer p(c, 1, 0);
  EXPECT_NEAR(p.produced_share(0.0), 1.0 / 3, 1e-12);  // the last layer's region: right after the forward
  EXPECT_NEAR(p.produced_share(0.5), 2.0 / 3, 1e-12);
  EXPECT_NEAR(p.produced_share(1.0), 1.0, 1e-12);       // the first layer's: the end of the step
  EXPECT_NEAR(p.produced_share(0.0, 4), (3 + 1.0 / 3) / 4, 1e-12);  // only the last of 4 micro-batches' backward
  p.begin(0);
  const double t0 = now_seconds();
  p.wait_until_produced(0.5);
  const double waited = now_seconds() - t0;
  EXPECT_GE(waited, 0.3 * 2 / 3 - 2e-3);
  p.wait_until_produced(0.0);  // a moment already passed: at once
  const StepTiming t = p.end_compute();
  EXPECT_NEAR(t.modelled_s, 0.3, 1e-12);
  c.overlap = false;
  StepPacer off(c, 1, 0);
  off.begin(0);
  const double t1 = now_seconds();
  off.wait_until_produced(1.0);
  EXPECT_LT(now_seconds() - t1, 0.1);  // without overlap the gate never holds a region
}

TEST(EmulateConfig, DerivesTheStepTimeFromATargetDevice) {
  EmulateConfig c;
  c.target_params = 124000000;
  c.target_tokens = 65536;
  c.peak_tflops = 989;
  c.mfu = 0.4;
  c.dilation = 10;
  // 10 * 6 * 124e6 * 65536 / (989e12 * 0.4) = 1.2326 s
  EXPECT_NEAR(c.base_step_s(), 10 * 6 * 124e6 * 65536 / (989e12 * 0.4), 1e-9);
  EXPECT_TRUE(c.enabled());
  c.validate();
}

TEST(EmulateConfig, RefusesWhatItCannotModelNamingTheField) {
  struct Case {
    const char* field;  // the error must name it
    std::function<void(EmulateConfig&)> set;
  };
  const std::vector<Case> cases = {
      {"emulate.slowdown", [](EmulateConfig& c) { c.slowdown = 3; }},  // a factor on no modelled time
      {"emulate.jitter", [](EmulateConfig& c) { c.jitter = 0.1; }},
      {"emulate.target_params", [](EmulateConfig& c) { c.step_time_s = 0.5, c.target_params = 1000, c.target_tokens = 1000; }},
      {"emulate.target_tokens", [](EmulateConfig& c) { c.target_params = 1000; }},
  };
  for (const Case& k : cases) {
    EmulateConfig c;
    k.set(c);
    try {
      c.validate();
      ADD_FAILURE() << "accepted: " << k.field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(k.field), std::string::npos) << e.what();
    }
  }
  EmulateConfig ok;
  ok.step_time_s = 0.5;
  ok.slowdown = 3;
  ok.jitter = 0.2;
  ok.validate();
}

// emulate.slowdown_from_step: a node that slows mid-run (issue 29's switch study) takes its slowdown
// from that step on, and its own time before it.
TEST(StepPacer, TheSlowdownStartsAtItsStep) {
  EmulateConfig c;
  c.step_time_s = 0.1;
  c.slowdown = 3;
  c.slowdown_from_step = 5;
  StepPacer p(c, 1, 0);
  EXPECT_DOUBLE_EQ(p.modelled_s(0), 0.1);
  EXPECT_DOUBLE_EQ(p.modelled_s(4), 0.1);
  EXPECT_DOUBLE_EQ(p.modelled_s(5), 0.1 * 3);
  EXPECT_DOUBLE_EQ(p.modelled_s(100), 0.1 * 3);
  c.slowdown_from_step = 0;  // the default: every step
  EXPECT_DOUBLE_EQ(StepPacer(c, 1, 0).modelled_s(0), 0.1 * 3);
}
