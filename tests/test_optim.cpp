// Optimizer pieces: the flat AdamW against torch::optim::AdamW, the LR schedule, clipping,
// flat parameter views, gradient accumulation.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "common/flat_adamw.h"
#include "model/gpt.h"
#include "model/flat_parameters.h"
#include "worker/train/lr_schedule.h"

using namespace syncopate;

TEST(FlatAdamW, MatchesTorchAdamWReference) {
  torch::manual_seed(0);
  auto w1 = torch::randn({40, 30}), b1 = torch::randn({30});
  AdamWConfig c;
  c.weight_decay = 0.1;
  c.beta2 = 0.95;
  // Reference: torch's AdamW on two tensors, decay on the matrix only (two param groups).
  auto rw = w1.clone().requires_grad_(true), rb = b1.clone().requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{rw}, std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(1e-2).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay)));
  groups.emplace_back(std::vector<torch::Tensor>{rb}, std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(1e-2).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(0.0)));
  torch::optim::AdamW ref(groups);
  // Ours: one flat buffer, decay range = the matrix.
  auto flat = torch::cat({w1.reshape(-1), b1});
  FlatAdamW ours(c, flat.numel(), {{0, w1.numel()}}, flat.options());
  for (int step = 0; step < 5; ++step) {
    auto gw = torch::randn({40, 30}), gb = torch::randn({30});
    const double lr = 1e-2 * (step + 1) / 5.0;
    for (auto& g : ref.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    rw.mutable_grad() = gw.clone();
    rb.mutable_grad() = gb.clone();
    ref.step();
    ours.step(flat, torch::cat({gw.reshape(-1), gb}), lr);
  }
  EXPECT_TRUE(torch::allclose(flat, torch::cat({rw.detach().reshape(-1), rb.detach()}), 1e-6, 1e-6));
  EXPECT_EQ(ours.steps(), 5);
}

TEST(LrSchedule, WarmupThenCosineToFloor) {
  ScheduleConfig s;
  s.warmup_steps = 10;
  s.warmup_start_lr = 3e-5;
  s.min_lr = 1e-6;
  const double peak = 6e-4;
  EXPECT_DOUBLE_EQ(lr_at(s, peak, 0, 100), 3e-5);
  EXPECT_DOUBLE_EQ(lr_at(s, peak, 5, 100), 3e-5 + (peak - 3e-5) * 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, peak, 10, 100), peak);
  EXPECT_NEAR(lr_at(s, peak, 55, 101), (peak + 1e-6) / 2, 1e-12);  // half-way through the decay
  EXPECT_DOUBLE_EQ(lr_at(s, peak, 99, 100), 1e-6);
  for (int i = 11; i < 100; ++i) EXPECT_LE(lr_at(s, peak, i, 100), lr_at(s, peak, i - 1, 100));
}

// The schedule by a share of it (syncopate-sim's sim.time_schedule: elapsed / budget): the same
// warmup and cosine, min_lr from the end on; at a step grid it is the step schedule whose warmup is
// warmup_frac of the run (a 1001-step run: step k at progress k / 1000).
TEST(LrSchedule, ByProgressHasTheStepScheduleShape) {
  ScheduleConfig s;
  s.warmup_frac = 0.05;
  s.warmup_start_lr = 3e-5;
  s.min_lr = 1e-6;
  const double peak = 6e-4;
  EXPECT_DOUBLE_EQ(lr_at_progress(s, peak, 0.0), 3e-5);
  EXPECT_DOUBLE_EQ(lr_at_progress(s, peak, 0.025), 3e-5 + (peak - 3e-5) * 0.5);
  EXPECT_DOUBLE_EQ(lr_at_progress(s, peak, 0.05), peak);
  EXPECT_NEAR(lr_at_progress(s, peak, 0.525), (peak + 1e-6) / 2, 1e-12);  // half-way through the decay
  EXPECT_DOUBLE_EQ(lr_at_progress(s, peak, 1.0), 1e-6);
  EXPECT_DOUBLE_EQ(lr_at_progress(s, peak, 1.7), 1e-6);  // past the budget: the floor
  for (int k = 0; k <= 1000; ++k)
    EXPECT_NEAR(lr_at_progress(s, peak, k / 1000.0), lr_at(s, peak, k, 1001), 1e-15) << k;
}

// Warmup as a share of the run: runs of 100 and 1000 steps warm up over 5 and 50 steps, each
// ending its cosine at its own last step.
TEST(LrSchedule, WarmupFractionScalesWithTheRun) {
  ScheduleConfig s;
  s.warmup_steps = 10;  // ignored once warmup_frac is set
  s.warmup_frac = 0.05;
  s.warmup_start_lr = 0;
  s.min_lr = 0;
  EXPECT_EQ(warmup_steps_of(s, 100), 5);
  EXPECT_EQ(warmup_steps_of(s, 1000), 50);
  EXPECT_EQ(warmup_steps_of(s, 3), 1);  // at least one step
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 0, 100), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 5, 100), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 25, 1000), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 50, 1000), 1.0);
  EXPECT_NEAR(lr_at(s, 1.0, 999, 1000), 0.0, 1e-12);
  EXPECT_NEAR(lr_at(s, 1.0, 99, 100), 0.0, 1e-12);
  s.warmup_frac = 0;
  EXPECT_EQ(warmup_steps_of(s, 1000), 10);
}

TEST(Clipping, ScalesToMaxNormAndReportsNorm) {
  auto g = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(clip_grad_norm(g, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(g.norm().item<double>(), 1.0, 1e-5);
  auto h = torch::tensor({0.3f, 0.4f});
  clip_grad_norm(h, 1.0);
  EXPECT_TRUE(torch::equal(h, torch::tensor({0.3f, 0.4f})));  // below the limit: untouched
  clip_grad_norm(h, 0.0);
  EXPECT_TRUE(torch::equal(h, torch::tensor({0.3f, 0.4f})));  // 0 disables
}

TEST(FlatParameters, ParamsAndGradsAreViews) {
  auto c = gpt_preset("tiny");
  c.n_embd = 32;
  c.n_head = 2;
  GPT m(c);
  FlatParameters flat(*m);
  int64_t n = 0;
  for (auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(flat.numel(), n);
  auto idx = torch::randint(0, 257, {2, 8}, torch::kLong);
  m->loss(idx, idx).backward();
  // Autograd accumulated into the flat buffer, and writes to the buffer reach the parameters.
  EXPECT_GT(flat.grads.abs().sum().item<double>(), 0);
  const auto& s = flat.segments[3];
  EXPECT_TRUE(torch::equal(flat.grads.narrow(0, s.offset, s.numel), m->parameters()[3].grad().reshape(-1)));
  flat.params.zero_();
  EXPECT_EQ(m->parameters()[3].abs().sum().item<double>(), 0);
  // Decay applies to 2-D weights only.
  for (const auto& seg : flat.segments) EXPECT_EQ(seg.decay, seg.shape.size() == 2) << seg.name;
}

TEST(GradAccumulation, KMicroBatchesEqualOneBigBatch) {
  auto c = gpt_preset("tiny");
  c.n_embd = 32;
  c.n_head = 2;
  c.block_size = 16;
  torch::manual_seed(5);
  GPT m(c);
  FlatParameters flat(*m);
  auto x = torch::randint(0, 257, {8, 16}, torch::kLong), y = torch::randint(0, 257, {8, 16}, torch::kLong);
  m->loss(x, y).backward();
  auto big = flat.grads.clone();
  flat.zero_grad();
  const int k = 4;
  for (int i = 0; i < k; ++i) (m->loss(x.narrow(0, 2 * i, 2), y.narrow(0, 2 * i, 2)) / k).backward();
  EXPECT_TRUE(torch::allclose(flat.grads, big, 1e-5, 1e-6)) << (flat.grads - big).abs().max().item<double>();
}
