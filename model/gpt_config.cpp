#include "model/gpt_config.h"

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

GPTConfig gpt_preset(const std::string& name) {
  GPTConfig c;
  c.preset = name;
  auto shape = [&](int64_t vocab, int64_t block, int64_t layer, int64_t head, int64_t embd) {
    c.vocab_size = vocab; c.block_size = block; c.n_layer = layer; c.n_head = head; c.n_embd = embd;
  };
  if (name == "micro") shape(257, 64, 2, 2, 64);
  else if (name == "tiny") shape(257, 128, 2, 4, 128);
  else if (name == "small") shape(257, 256, 4, 8, 256);
  else if (name == "gpt2") { shape(50257, 1024, 12, 12, 768); c.dropout = 0.1; }
  else if (name == "gpt2-medium") { shape(50257, 1024, 24, 16, 1024); c.dropout = 0.1; }
  else SYN_FAIL(fmt::format("unknown model preset '{}'", name), "use micro, tiny, small, gpt2 or gpt2-medium");
  return c;
}

void validate(const GPTConfig& c) {
  SYN_CHECK(c.n_embd % c.n_head == 0,
            fmt::format("model.n_head={} does not divide model.n_embd={}", c.n_head, c.n_embd),
            "pick n_head so that n_embd / n_head is a whole number (64 is typical)");
}

double gpt_train_flops_per_token(const GPTConfig& c) {
  return 6.0 * static_cast<double>(gpt_num_params(c)) +
         12.0 * static_cast<double>(c.n_layer) * static_cast<double>(c.block_size) * static_cast<double>(c.n_embd);
}

int64_t gpt_num_params(const GPTConfig& c) {
  const int64_t C = c.n_embd;
  int64_t per_block = 2 * 2 * C                       // two LayerNorms
                      + C * 3 * C + (c.qkv_bias ? 3 * C : 0) + C * C + C  // attention
                      + C * 4 * C + 4 * C + 4 * C * C + C;                // MLP
  return c.padded_vocab() * C + c.block_size * C + c.n_layer * per_block + 2 * C;
}

}  // namespace syncopate
