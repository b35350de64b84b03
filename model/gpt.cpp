#include "model/gpt.h"

#include <cmath>
#include <limits>

#include <torch/autograd.h>
#include <torch/nn/functional.h>
#include <torch/nn/init.h>
#include <torch/version.h>
#include <ATen/ATen.h>

#include "common/check.h"

namespace syncopate {
namespace F = torch::nn::functional;

#if TORCH_VERSION_MAJOR >= 2
constexpr bool kHaveSdpa = true;
#else
constexpr bool kHaveSdpa = false;
#endif

bool sdpa_available() { return kHaveSdpa; }

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c)
    : n_head_(c.n_head), dropout_(c.dropout) {
  c_attn = register_module("c_attn", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, 3 * c.n_embd).bias(c.qkv_bias)));
  c_proj = register_module("c_proj", torch::nn::Linear(c.n_embd, c.n_embd));
  SYN_CHECK(c.attention != "sdpa" || kHaveSdpa, "model.attention=sdpa but this LibTorch has no scaled_dot_product_attention",
            "use model.attention=auto or explicit, or LibTorch >= 2.0");
  use_sdpa_ = c.attention == "sdpa" || (c.attention == "auto" && kHaveSdpa);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head_;
  auto qkv = c_attn(x).split(C, /*dim=*/2);
  auto q = qkv[0].view({B, T, n_head_, hd}).transpose(1, 2);  // [B, nh, T, hd]
  auto k = qkv[1].view({B, T, n_head_, hd}).transpose(1, 2);
  auto v = qkv[2].view({B, T, n_head_, hd}).transpose(1, 2);
  const double p = is_training() ? dropout_ : 0.0;
  torch::Tensor y;
#if TORCH_VERSION_MAJOR >= 2
  if (use_sdpa_) y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#endif
  if (!use_sdpa_) {
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).tril();
    att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    att = torch::dropout(att, p, is_training());
    y = torch::matmul(att, v);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  return torch::dropout(c_proj(y), dropout_, is_training());
}

MLPImpl::MLPImpl(const GPTConfig& c) : dropout_(c.dropout) {
  c_fc = register_module("c_fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto y = c_proj(at::gelu(c_fc(x), "tanh"));  // GPT-2's tanh approximation
  return torch::dropout(y, dropout_, is_training());
}

BlockImpl::BlockImpl(const GPTConfig& c) {
  auto ln = torch::nn::LayerNormOptions({c.n_embd}).eps(1e-5);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(ln));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(ln));
  mlp = register_module("mlp", MLP(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

namespace {
// Activation checkpointing: run a block without keeping its activations, then recompute it
// (with the same dropout RNG) inside backward and backpropagate through the recomputation.
struct CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t block_ptr) {
    ctx->saved_data["block"] = block_ptr;
    ctx->saved_data["rng"] = at::detail::getDefaultCPUGenerator().get_state();
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return reinterpret_cast<BlockImpl*>(block_ptr)->forward(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    auto gen = at::detail::getDefaultCPUGenerator();
    auto rng_now = gen.get_state();
    gen.set_state(ctx->saved_data["rng"].toTensor());
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Tensor y;
    {
      torch::AutoGradMode enable(true);
      y = block->forward(x);
    }
    gen.set_state(rng_now);
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), torch::Tensor()};
  }
};
}  // namespace

GPTImpl::GPTImpl(const GPTConfig& c) : cfg_(c) {
  validate(c);
  wte = register_module("wte", torch::nn::Embedding(c.padded_vocab(), c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(1e-5)));
  init_weights();
}

void GPTImpl::init_weights() {
  torch::NoGradGuard no_grad;
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  for (auto& kv : named_parameters()) {
    const std::string& name = kv.key();
    auto& p = kv.value();
    bool is_weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
    if (name.find("ln_") != std::string::npos) {
      is_weight ? p.fill_(1.0) : p.zero_();
    } else if (!is_weight) {
      p.zero_();
    } else if (name.find("c_proj.weight") != std::string::npos) {
      p.normal_(0.0, proj_std);  // residual projections, scaled by 1/sqrt(2 * n_layer)
    } else {
      p.normal_(0.0, std);
    }
  }
  const int64_t V = cfg_.vocab_size, P = cfg_.padded_vocab();
  if (P > V) wte->weight.narrow(0, V, P - V).zero_();  // padding rows: never used, kept at zero
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  SYN_CHECK(T <= cfg_.block_size,
            fmt::format("sequence of {} tokens exceeds model.block_size={}", T, cfg_.block_size),
            "crop the input or train a model with a longer context");
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = torch::dropout(wte(idx) + wpe(pos), cfg_.dropout, is_training());
  for (const auto& m : *h) {
    auto* block = m->as<BlockImpl>();
    if (cfg_.activation_checkpointing && is_training() && torch::GradMode::is_enabled())
      x = CheckpointedBlock::apply(x, reinterpret_cast<int64_t>(block));
    else
      x = block->forward(x);
  }
  x = ln_f(x);
  auto logits = F::linear(x, wte->weight);  // LM head tied to the token embedding
  // Padded vocabulary entries are not tokens: -inf logits give them zero probability and zero
  // gradient, so the model is exactly a vocab_size model (and exports to HF losslessly).
  const int64_t V = cfg_.vocab_size, P = cfg_.padded_vocab();
  if (P > V) logits.narrow(-1, V, P - V).fill_(-std::numeric_limits<float>::infinity());
  return logits;
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);
  return F::cross_entropy(logits.view({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
}

}  // namespace syncopate
