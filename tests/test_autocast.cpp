// worker/train/autocast.h on a GPU (issue 28 (1)): the trainer's AutocastGuard computes with the
// weights as they are now, also after an in-place update between two forwards, while LibTorch's
// own autocast without the guard demonstrably serves a stale bf16 cast in that case (the control:
// it shows the bug the guard exists for is real in the LibTorch we link). Then the model's
// checkpointed recompute across two training steps with an in-place update between them, backward
// on autograd's device thread as in training. CUDA only: skipped, with the reason, without a GPU
// (LibTorch's CPU autocast reuses no cast, so there is nothing to show on CPU; see
// GPT.CheckpointingMatchesAcrossAnInPlaceUpdateWithBackwardOnAnotherThread).
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "model/gpt.h"
#include "worker/train/autocast.h"

using namespace syncopate;

namespace {
// x @ w under CUDA bf16 autocast, w an fp32 leaf that requires grad (the casts autocast caches),
// twice, with w doubled in place between: the two results, each as float on the CPU.
std::pair<torch::Tensor, torch::Tensor> matmul_around_update(bool with_guard) {
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(5);
  auto x = torch::randn({64, 64}).to(gpu);
  auto w = torch::randn({64, 64}).to(gpu).set_requires_grad(true);
  torch::Tensor first, second;
  if (with_guard) {
    AutocastGuard outer(true);  // an enclosing scope keeps the nesting above 0, as a long forward
    {
      AutocastGuard ac(true);
      first = torch::matmul(x, w).to(torch::kFloat).cpu();
    }
    {
      torch::NoGradGuard ng;
      w.mul_(2);
    }
    {
      AutocastGuard ac(true);
      second = torch::matmul(x, w).to(torch::kFloat).cpu();
    }
  } else {
    // Autocast as a caller without the guard uses it: enabled, cache on (LibTorch's default), the
    // nesting above 0 so the cache is not cleared between the two products.
    const bool was = at::autocast::is_autocast_enabled(at::kCUDA);
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_cache_enabled(true);
    at::autocast::increment_nesting();
    first = torch::matmul(x, w).to(torch::kFloat).cpu();
    {
      torch::NoGradGuard ng;
      w.mul_(2);
    }
    second = torch::matmul(x, w).to(torch::kFloat).cpu();
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_cache_enabled(cache);
    at::autocast::set_autocast_enabled(at::kCUDA, was);
  }
  return {first, second};
}
}  // namespace

// The control: without the guard, LibTorch's cache hands the second product the bf16 cast of the
// weights before the update (the product does not double). If this ever fails, this LibTorch no
// longer has the stale cast, and the next test proves nothing beyond plain correctness.
TEST(AutocastGuard, CudaControlLibTorchsCacheServesAStaleCastWithoutTheGuard) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (scripts/gpu_check.sh runs this on a GPU)";
  const auto [first, second] = matmul_around_update(false);
  EXPECT_TRUE(torch::equal(first, second)) << "max |second - first| = " << (second - first).abs().max().item<double>()
                                           << ": the cast was not reused (no stale cast in this LibTorch)";
}

// With the trainer's guard the second product is computed from the doubled weights: exactly twice
// the first (doubling is exact in bf16 and fp32, so the products are exact multiples too).
TEST(AutocastGuard, CudaCastsFollowAnInPlaceUpdate) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (scripts/gpu_check.sh runs this on a GPU)";
  const auto [first, second] = matmul_around_update(true);
  EXPECT_TRUE(torch::equal(second, first * 2)) << "max |second - 2 first| = "
                                               << (second - first * 2).abs().max().item<double>();
}

// The model in training's shape: forward under the trainer's guard, backward outside it (on CUDA
// it runs on autograd's device thread), an in-place update of every weight, a second step:
// checkpointing on and off give the same step-2 gradients. A stale cast in the recompute would
// give the checkpointed run the step-1 weights' activations.
TEST(AutocastGuard, CudaCheckpointingMatchesAcrossAnInPlaceUpdate) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (scripts/gpu_check.sh runs this on a GPU)";
  const torch::Device gpu(torch::kCUDA, 0);
  auto step2_grads = [&](bool ckpt) {
    GPTConfig c = gpt_preset("micro");
    c.dropout = 0;
    c.activation_checkpointing = ckpt;
    torch::manual_seed(3);
    GPT m(c);
    m->to(gpu);
    m->train();
    auto idx = (torch::arange(4 * 64, torch::kLong).reshape({4, 64}) % c.vocab_size).to(gpu);
    auto tgt = (idx * 7 + 3) % c.vocab_size;
    for (int step = 0;; ++step) {
      for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
      torch::Tensor loss;
      {
        AutocastGuard ac(true);
        loss = m->loss(idx, tgt);
      }
      loss.backward();
      if (step == 1) {
        std::vector<torch::Tensor> g;
        for (auto& p : m->parameters()) g.push_back(p.grad().cpu().clone());
        return g;
      }
      torch::NoGradGuard ng;
      for (auto& p : m->parameters()) p.mul_(1.5);  // in place, as AdamW: the same tensors, new values
    }
  };
  const auto plain = step2_grads(false), ckpt = step2_grads(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::allclose(ckpt[i], plain[i], 1e-3, 1e-5))
        << "parameter " << i << ": max |ckpt - plain| = " << (ckpt[i] - plain[i]).abs().max().item<double>();
}
