// The model: shapes, causality, both attention paths, initial loss, activation checkpointing.
#include <gtest/gtest.h>

#include <cmath>

#include <torch/torch.h>

#include "model/generate.h"
#include "model/gpt.h"

using namespace syncopate;

namespace {
GPTConfig small_config() {
  GPTConfig c = gpt_preset("tiny");
  c.n_layer = 2;
  c.n_embd = 48;
  c.n_head = 3;
  c.block_size = 16;
  return c;
}
}  // namespace

TEST(GPT, ShapesAndPaddedVocab) {
  auto c = small_config();
  GPT m(c);
  auto idx = torch::randint(0, c.vocab_size, {2, 10}, torch::kLong);
  auto logits = m->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10, 320}));  // 257 padded to 320
  EXPECT_EQ(m->wte->weight.size(0), c.padded_vocab());
  int64_t n = 0;
  for (auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(n, gpt_num_params(c));
  EXPECT_EQ(gpt_num_params(gpt_preset("gpt2")) - 50304 * 768, 124439808 - 50257 * 768);  // GPT-2's 124M
}

TEST(GPT, RejectsTooLongSequence) {
  auto c = small_config();
  GPT m(c);
  EXPECT_THROW(m->forward(torch::zeros({1, c.block_size + 1}, torch::kLong)), std::exception);
}

TEST(GPT, CausalityLaterTokensNeverChangeEarlierLogits) {
  auto c = small_config();
  torch::manual_seed(0);
  GPT m(c);
  m->eval();
  auto a = torch::randint(0, c.vocab_size, {1, 12}, torch::kLong);
  auto b = a.clone();
  b.index_put_({0, 7}, (a.index({0, 7}).item<int64_t>() + 1) % c.vocab_size);
  auto la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(torch::equal(la.narrow(1, 0, 7), lb.narrow(1, 0, 7)));
  EXPECT_FALSE(torch::allclose(la.narrow(1, 7, 1), lb.narrow(1, 7, 1)));
}

TEST(GPT, SdpaEqualsExplicitAttention) {
  if (!sdpa_available()) GTEST_SKIP() << "LibTorch < 2.0 has no scaled_dot_product_attention";
  auto c = small_config();
  c.attention = "sdpa";
  torch::manual_seed(1);
  GPT a(c);
  c.attention = "explicit";
  torch::manual_seed(1);
  GPT b(c);
  a->eval();
  b->eval();
  auto idx = torch::randint(0, c.vocab_size, {3, 16}, torch::kLong);
  auto la = a->forward(idx), lb = b->forward(idx);
  EXPECT_TRUE(torch::allclose(la, lb, 1e-5, 1e-5)) << (la - lb).abs().max().item<double>();
}

TEST(GPT, UntrainedLossIsLogVocab) {
  auto c = small_config();
  torch::manual_seed(2);
  GPT m(c);
  auto idx = torch::randint(0, c.vocab_size, {8, 16}, torch::kLong);
  auto tgt = torch::randint(0, c.vocab_size, {8, 16}, torch::kLong);
  double loss = m->loss(idx, tgt).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(c.vocab_size)), 0.05);  // padding has -inf logits
}

TEST(GPT, ActivationCheckpointingGivesSameGradients) {
  auto c = small_config();
  c.dropout = 0.1;  // the recomputation must replay the same dropout masks
  auto grads = [&](bool ckpt) {
    c.activation_checkpointing = ckpt;
    torch::manual_seed(3);
    GPT m(c);
    m->train();
    auto idx = torch::randint(0, c.vocab_size, {2, 16}, torch::kLong);
    auto tgt = torch::randint(0, c.vocab_size, {2, 16}, torch::kLong);
    torch::manual_seed(4);
    m->loss(idx, tgt).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  auto a = grads(false), b = grads(true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6)) << "parameter " << i;
}

// Issue 15 (12): generation's values, against a readable reference: greedy decoding is the argmax
// of the model's last-position logits over the real vocabulary, one token at a time, on a context
// cropped to block_size (the prompt here is longer than the block); top_k = 1 sampling is greedy;
// sampling is reproducible from its seed, and never draws a padded vocabulary row.
TEST(GPT, GenerateEqualsAReferenceDecodingLoop) {
  torch::manual_seed(7);
  auto c = small_config();
  GPT m(c);
  m->train();  // generate() must switch to eval (dropout off) and back
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < c.block_size + 5; ++i) prompt.push_back((i * 37) % c.vocab_size);
  const int64_t n_new = 12;
  SamplingOptions greedy;
  const auto got = generate(*m, prompt, n_new, greedy);
  EXPECT_TRUE(m->is_training());
  std::vector<int64_t> ref = prompt;
  {
    m->eval();
    torch::NoGradGuard ng;
    for (int64_t t = 0; t < n_new; ++t) {
      const int64_t from = std::max<int64_t>(0, static_cast<int64_t>(ref.size()) - c.block_size);
      auto idx = torch::tensor(std::vector<int64_t>(ref.begin() + from, ref.end()), torch::kLong).unsqueeze(0);
      auto logits = m->forward(idx).index({0, -1}).slice(0, 0, c.vocab_size);
      ref.push_back(logits.argmax().item<int64_t>());
    }
    m->train();
  }
  EXPECT_EQ(got, ref);
  SamplingOptions top1;
  top1.greedy = false, top1.top_k = 1, top1.seed = 5;
  EXPECT_EQ(generate(*m, prompt, n_new, top1), ref);
  SamplingOptions hot;
  hot.greedy = false, hot.temperature = 5.0, hot.seed = 11;  // flat: every row is likely, padded ones must not come
  const auto a = generate(*m, prompt, 200, hot), b = generate(*m, prompt, 200, hot);
  EXPECT_EQ(a, b);
  for (int64_t id : a) EXPECT_LT(id, c.vocab_size);
  hot.seed = 12;
  EXPECT_NE(generate(*m, prompt, 200, hot), a);
  EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + static_cast<int64_t>(prompt.size())), prompt);
}
