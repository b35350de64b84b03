// GPT-2-style decoder-only transformer. Knows nothing of distribution or training.
// Parameter names equal Hugging Face GPT-2's (without the "transformer." prefix): wte, wpe,
// h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f.
// Linear weights are stored [out, in] (GPT-2's Conv1D stores [in, out]; see hf_weights.h).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "model/gpt_config.h"

namespace syncopate {

// True when this LibTorch has scaled_dot_product_attention (2.0+).
bool sdpa_available();

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // x: [B, T, C] -> [B, T, C]
  torch::nn::Linear c_attn{nullptr};  // [3C, C]: query, key, value
  torch::nn::Linear c_proj{nullptr};  // [C, C]: output projection (residual)
 private:
  int64_t n_head_;
  double dropout_;
  bool use_sdpa_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, C] -> [B, T, C]
  torch::nn::Linear c_fc{nullptr};    // [4C, C]
  torch::nn::Linear c_proj{nullptr};  // [C, 4C] (residual)
 private:
  double dropout_;
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // pre-LN: x + attn(ln_1(x)); x + mlp(ln_2(x))
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& c);
  // idx: [B, T] int64 token ids, T <= block_size. Returns logits [B, T, padded_vocab]; the
  // padded entries (ids >= vocab_size) are -inf.
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean cross-entropy of next-token prediction; targets [B, T] int64.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  const GPTConfig& config() const { return cfg_; }

  torch::nn::Embedding wte{nullptr};  // [padded_vocab, C], tied with the LM head
  torch::nn::Embedding wpe{nullptr};  // [block_size, C]
  torch::nn::ModuleList h{nullptr};   // n_layer Blocks
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  void init_weights();
  GPTConfig cfg_;
};
TORCH_MODULE(GPT);

}  // namespace syncopate
