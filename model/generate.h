// Autoregressive sampling from a GPT: greedy, or temperature with optional top-k.
#pragma once
#include <cstdint>
#include <vector>

namespace syncopate {
class GPTImpl;

struct SamplingOptions {
  bool greedy = true;        // argmax at every step (ignores temperature and top_k)
  double temperature = 1.0;  // > 0; divides the logits
  int64_t top_k = 0;         // sample among the k most likely tokens; 0 = all
  uint64_t seed = 0;         // private generator: sampling never disturbs training's RNG
};

// Returns prompt + max_new_tokens generated ids. The context is cropped to the model's
// block_size; padded vocabulary rows are never sampled. Runs in eval mode without gradients and
// restores the model's train/eval mode afterwards.
std::vector<int64_t> generate(GPTImpl& model, const std::vector<int64_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& opt);

}  // namespace syncopate
