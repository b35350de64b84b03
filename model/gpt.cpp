#include "model/gpt.h"

#include <cmath>
#include <limits>
#include <mutex>

#include <torch/autograd.h>
#include <torch/nn/functional.h>
#include <torch/nn/init.h>
#include <torch/version.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include "common/check.h"

namespace syncopate {
namespace F = torch::nn::functional;

#if TORCH_VERSION_MAJOR >= 2
constexpr bool kHaveSdpa = true;
#else
constexpr bool kHaveSdpa = false;
#endif

bool sdpa_available() { return kHaveSdpa; }

namespace {
// torch::dropout's function (keep with probability 1 - p, scale by 1 / (1 - p)) drawing from the
// model's generator.
torch::Tensor dropout(const torch::Tensor& x, double p, bool training, const DropoutRng& rng) {
  if (!training || p <= 0) return x;
  if (!rng.gen.defined()) return torch::dropout(x, p, true);
  auto keep = at::empty_like(x).bernoulli_(1.0 - p, rng.gen);
  return x * keep * (1.0 / (1.0 - p));
}
}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c, std::shared_ptr<DropoutRng> rng)
    : n_head_(c.n_head), dropout_(c.dropout), rng_(std::move(rng)) {
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
  // Fused attention draws its dropout from the device's default generator: only when that is the
  // model's (see DropoutRng); else the explicit path with the model's generator.
  const bool sdpa = use_sdpa_ && (p == 0 || rng_->sdpa);
  torch::Tensor y;
#if TORCH_VERSION_MAJOR >= 2
  if (sdpa) y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
#endif
  if (!sdpa) {
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).tril();
    att = att.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    att = dropout(att, p, is_training(), *rng_);
    y = torch::matmul(att, v);
  }
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  return dropout(c_proj(y), dropout_, is_training(), *rng_);
}

MLPImpl::MLPImpl(const GPTConfig& c, std::shared_ptr<DropoutRng> rng) : dropout_(c.dropout), rng_(std::move(rng)) {
  c_fc = register_module("c_fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto y = c_proj(at::gelu(c_fc(x), "tanh"));  // GPT-2's tanh approximation
  return dropout(y, dropout_, is_training(), *rng_);
}

BlockImpl::BlockImpl(const GPTConfig& c, std::shared_ptr<DropoutRng> rng) {
  auto ln = torch::nn::LayerNormOptions({c.n_embd}).eps(1e-5);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(ln));
  attn = register_module("attn", CausalSelfAttention(c, rng));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(ln));
  mlp = register_module("mlp", MLP(c, rng));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

namespace {
// The autocast settings of the devices a block may run on, captured in forward and put back
// around the recompute: backward runs outside the forward's autocast scope (on CUDA on
// autograd's own thread), and a recompute in another precision would be another function.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  static AutocastState now() {
    AutocastState a;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    a.cpu = at::autocast::is_autocast_enabled(at::kCPU);
    a.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    a.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    a.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
    a.cpu = at::autocast::is_cpu_enabled();
    a.cuda = at::autocast::is_enabled();
    a.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
    a.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
    return a;
  }
  void apply() const {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
#else
    at::autocast::set_cpu_enabled(cpu);
    at::autocast::set_enabled(cuda);
    at::autocast::set_autocast_cpu_dtype(cpu_dtype);
    at::autocast::set_autocast_gpu_dtype(cuda_dtype);
#endif
  }
};

// The generator a block's dropout draws from: the model's, else the default of x's device.
at::Generator block_generator(const DropoutRng& rng, const torch::Tensor& x) {
  if (rng.gen.defined()) return rng.gen;
  return x.is_cuda() ? at::globalContext().defaultGenerator(x.device()) : at::detail::getDefaultCPUGenerator();
}

// Activation checkpointing: run a block without keeping its activations, then recompute it inside
// backward and backpropagate through the recomputation. The recompute is the same function as
// the forward (as torch.utils.checkpoint makes it): the dropout generator's state and the
// autocast settings of the forward are restored around it, and the generator's own state after
// it (state reads and writes under the generator's lock).
struct CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t block_ptr, int64_t rng_ptr) {
    const auto& rng = *reinterpret_cast<const DropoutRng*>(rng_ptr);
    at::Generator gen = block_generator(rng, x);
    ctx->saved_data["block"] = block_ptr;
    ctx->saved_data["rng_ptr"] = rng_ptr;
    {
      std::lock_guard<std::mutex> l(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    const AutocastState a = AutocastState::now();
    ctx->saved_data["autocast"] = std::vector<int64_t>{a.cpu, a.cuda, static_cast<int64_t>(a.cpu_dtype),
                                                       static_cast<int64_t>(a.cuda_dtype)};
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return reinterpret_cast<BlockImpl*>(block_ptr)->forward(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    const auto& rng = *reinterpret_cast<const DropoutRng*>(ctx->saved_data["rng_ptr"].toInt());
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Generator gen = block_generator(rng, x);
    at::Tensor rng_now;
    {
      std::lock_guard<std::mutex> l(gen.mutex());
      rng_now = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    const auto ac = ctx->saved_data["autocast"].toIntVector();
    AutocastState forward_state;
    forward_state.cpu = ac[0], forward_state.cuda = ac[1];
    forward_state.cpu_dtype = static_cast<at::ScalarType>(ac[2]), forward_state.cuda_dtype = static_cast<at::ScalarType>(ac[3]);
    const AutocastState outside = AutocastState::now();
    // The recompute counts itself in autocast's nesting (as torch.utils.checkpoint's autocast
    // context does) and clears the thread's cache of weight casts when the count returns to 0: on
    // CUDA backward runs on autograd's device thread, where nothing else ever would, and the casts
    // of this step's weights would serve the next step's recompute after AdamW changed them.
    // The cast cache is off for the recompute, as in the forward's AutocastGuard: the cache is
    // process-wide, and this recompute's casts must neither serve another replica nor outlive the
    // optimizer step.
    const bool cache_outside = at::autocast::is_autocast_cache_enabled();
    auto leave = [&] {
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_cache_enabled(cache_outside);
      outside.apply();
    };
    torch::Tensor y;
    try {
      forward_state.apply();
      at::autocast::set_autocast_cache_enabled(false);
      at::autocast::increment_nesting();
      torch::AutoGradMode enable(true);
      y = block->forward(x);
    } catch (...) {
      leave();
      throw;
    }
    leave();
    {
      std::lock_guard<std::mutex> l(gen.mutex());
      gen.set_state(rng_now);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

GPTImpl::GPTImpl(const GPTConfig& c) : cfg_(c) {
  validate(c);
  wte = register_module("wte", torch::nn::Embedding(c.padded_vocab(), c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(Block(c, rng_));
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

void GPTImpl::seed_dropout(uint64_t seed) {
  const auto dev = wte->weight.device();
  if (dev.is_cuda()) {  // the device's default generator (fused attention draws from it too)
    rng_->gen = at::globalContext().defaultGenerator(dev);
    rng_->sdpa = true;
  } else if (!rng_->gen.defined() || rng_->gen.device().is_cuda()) {
    rng_->gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    rng_->sdpa = false;
  }
  std::lock_guard<std::mutex> l(rng_->gen.mutex());
  rng_->gen.set_current_seed(seed);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  SYN_CHECK(T <= cfg_.block_size,
            fmt::format("sequence of {} tokens exceeds model.block_size={}", T, cfg_.block_size),
            "crop the input or train a model with a longer context");
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = dropout(wte(idx) + wpe(pos), cfg_.dropout, is_training(), *rng_);
  for (const auto& m : *h) {
    auto* block = m->as<BlockImpl>();
    if (cfg_.activation_checkpointing && is_training() && torch::GradMode::is_enabled())
      x = CheckpointedBlock::apply(x, reinterpret_cast<int64_t>(block), reinterpret_cast<int64_t>(rng_.get()));
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
