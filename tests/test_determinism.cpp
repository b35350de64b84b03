// worker/train/determinism.h: train.deterministic turns LibTorch's deterministic mode on (warn-only),
// cuDNN's deterministic mode on and its autotuner off, and fixes cuBLAS's workspace; off restores
// LibTorch's defaults. On a GPU, two identical bf16 forward-backward passes then give the same
// gradients bit for bit (skipped, with the reason, without one; scripts/gpu_check.sh runs it and
// measures the noise floor of whole runs with the option).
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "model/gpt.h"
#include "worker/train/autocast.h"
#include "worker/train/determinism.h"

using namespace syncopate;

TEST(Determinism, TheOptionTurnsLibTorchsDeterministicModesOnAndOff) {
  apply_determinism(true);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly());
  EXPECT_TRUE(at::globalContext().deterministicCuDNN());
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  ASSERT_NE(ws, nullptr);
  EXPECT_TRUE(std::string(ws) == ":4096:8" || std::string(ws) == ":16:8") << ws;  // ours, or the environment's own
  apply_determinism(false);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().deterministicCuDNN());
}

TEST(Determinism, CudaTwoIdenticalBf16PassesGiveTheSameGradientsBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (scripts/gpu_check.sh runs this on a GPU)";
  apply_determinism(true);
  auto grads = [] {
    GPTConfig c = gpt_preset("tiny");
    c.dropout = 0;
    torch::manual_seed(3);
    GPT m(c);
    m->to(torch::Device(torch::kCUDA, 0));
    m->train();
    auto idx = (torch::arange(8 * c.block_size, torch::kLong).reshape({8, c.block_size}) % c.vocab_size).to(torch::kCUDA);
    auto tgt = (idx * 7 + 3) % c.vocab_size;
    torch::Tensor loss;
    {
      AutocastGuard ac(true);
      loss = m->loss(idx, tgt);
    }
    loss.backward();
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().cpu().clone());
    return g;
  };
  const auto a = grads(), b = grads();
  apply_determinism(false);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i << ": max |a - b| = " << (a[i] - b[i]).abs().max().item<double>();
}
