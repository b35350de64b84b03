#include "model/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "common/check.h"
#include "model/gpt.h"

namespace syncopate {

std::vector<int64_t> generate(GPTImpl& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const SamplingOptions& opt) {
  SYN_CHECK(!prompt.empty(), "cannot sample from an empty prompt", "give at least one token");
  SYN_CHECK(opt.greedy || opt.temperature > 0, "sampling temperature must be > 0", "use --greedy for temperature 0");
  const auto& cfg = model.config();
  for (auto id : prompt)
    SYN_CHECK(id >= 0 && id < cfg.vocab_size, fmt::format("prompt token {} is outside the vocabulary of {}", id, cfg.vocab_size),
              "check the prompt ids");
  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  const auto device = model.parameters().front().device();
  std::vector<int64_t> ids = prompt;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - cfg.block_size);
    auto ctx = torch::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), torch::kLong).view({1, -1}).to(device);
    auto logits = model.forward(ctx).select(1, ctx.size(1) - 1).narrow(-1, 0, cfg.vocab_size).to(torch::kCPU, torch::kFloat);
    int64_t next;
    if (opt.greedy) {
      next = logits.argmax(-1).item<int64_t>();
    } else {
      logits = logits / opt.temperature;
      if (opt.top_k > 0 && opt.top_k < cfg.vocab_size) {
        auto kth = std::get<0>(logits.topk(opt.top_k, -1)).select(-1, opt.top_k - 1).unsqueeze(-1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, -1), 1, false, gen).item<int64_t>();
    }
    ids.push_back(next);
  }
  if (was_training) model.train();
  return ids;
}

}  // namespace syncopate
