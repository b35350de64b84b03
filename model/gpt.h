// GPT-2-style decoder-only transformer. Knows nothing of distribution or training.
// Parameter names equal Hugging Face GPT-2's (without the "transformer." prefix): wte, wpe,
// h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f.
// Linear weights are stored [out, in] (GPT-2's Conv1D stores [in, out]; see hf_weights.h).
#pragma once
#include <memory>

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "model/gpt_config.h"

namespace syncopate {

// True when this LibTorch has scaled_dot_product_attention (2.0+).
bool sdpa_available();

// The generator every dropout of one model draws from, shared by its modules. Undefined: the
// device's default generator (a model nobody seeded: tests, generation). Seeded through
// GPTImpl::seed_dropout: on CPU a generator private to the model (local replicas are threads of
// one process; the default CPU generator would be shared and raced over), on CUDA the device's
// default one (one replica per device). `sdpa` says whether fused attention may draw its dropout
// from the default generator (it takes no generator argument): true only when that is ours.
struct DropoutRng {
  at::Generator gen;
  bool sdpa = true;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GPTConfig& c, std::shared_ptr<DropoutRng> rng);
  torch::Tensor forward(const torch::Tensor& x);  // x: [B, T, C] -> [B, T, C]
  torch::nn::Linear c_attn{nullptr};  // [3C, C]: query, key, value
  torch::nn::Linear c_proj{nullptr};  // [C, C]: output projection (residual)
 private:
  int64_t n_head_;
  double dropout_;
  bool use_sdpa_;
  std::shared_ptr<DropoutRng> rng_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const GPTConfig& c, std::shared_ptr<DropoutRng> rng);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, C] -> [B, T, C]
  torch::nn::Linear c_fc{nullptr};    // [4C, C]
  torch::nn::Linear c_proj{nullptr};  // [C, 4C] (residual)
 private:
  double dropout_;
  std::shared_ptr<DropoutRng> rng_;
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& c, std::shared_ptr<DropoutRng> rng);
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
  // Reseeds the generator of every dropout in this model (see DropoutRng). The trainer calls it
  // before each micro-batch with a seed from (train.seed, global rank, step, micro-batch): masks
  // differ between replicas and steps, are the same after a resume, and need no checkpointed
  // state. Call after the model is on its device.
  void seed_dropout(uint64_t seed);
  const DropoutRng& dropout_rng() const { return *rng_; }

  torch::nn::Embedding wte{nullptr};  // [padded_vocab, C], tied with the LM head
  torch::nn::Embedding wpe{nullptr};  // [block_size, C]
  torch::nn::ModuleList h{nullptr};   // n_layer Blocks
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  void init_weights();
  GPTConfig cfg_;
  std::shared_ptr<DropoutRng> rng_ = std::make_shared<DropoutRng>();
};
TORCH_MODULE(GPT);

}  // namespace syncopate
