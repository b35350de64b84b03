#include "model/hf_weights.h"

#include <regex>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <fmt/ranges.h>

#include "common/check.h"
#include "model/gpt.h"

namespace syncopate {
namespace {

// GPT-2 implements these projections with Conv1D, whose weight is [in, out].
bool is_conv1d_weight(const std::string& n) {
  for (const char* s : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
    if (n.size() >= std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0) return true;
  return false;
}

const at::Tensor* lookup(const Safetensors& st, const std::string& name) {
  for (const std::string& key : {name, "transformer." + name}) {
    auto it = st.tensors.find(key);
    if (it != st.tensors.end()) return &it->second;
  }
  return nullptr;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(GPTImpl& model, bool copy) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& kv : model.named_parameters()) {
    at::Tensor t = kv.value().detach().to(at::kCPU, at::kFloat, /*non_blocking=*/false, copy);
    if (kv.key() == "wte.weight") t = t.narrow(0, 0, model.config().vocab_size);
    if (is_conv1d_weight(kv.key())) t = t.t();
    out.emplace_back(kv.key(), t.contiguous());
  }
  return out;
}

void load_hf_tensors(GPTImpl& model, const Safetensors& st, const std::string& source) {
  torch::NoGradGuard no_grad;
  const std::string hint = "the file holds another model shape: pass the matching --model.* fields or preset";
  // Pass 1 validates every tensor, pass 2 copies: a mismatch leaves the model untouched.
  std::vector<std::pair<at::Tensor, at::Tensor>> plan;  // (parameter handle, source)
  for (auto& kv : model.named_parameters()) {
    const std::string& name = kv.key();
    const at::Tensor* src = lookup(st, name);
    SYN_CHECK(src, fmt::format("'{}' has no tensor '{}'", source, name), hint);
    at::Tensor t = is_conv1d_weight(name) ? src->t() : *src;
    at::Tensor& dst = kv.value();
    const bool padded_wte = name == "wte.weight" && t.dim() == 2 && t.size(0) <= dst.size(0) && t.size(1) == dst.size(1);
    SYN_CHECK(padded_wte || t.sizes() == dst.sizes(),
              fmt::format("'{}': tensor '{}' has shape {} but the model expects {}", source, name,
                          fmt::join(t.sizes(), "x"), fmt::join(dst.sizes(), "x")), hint);
    plan.emplace_back(dst, t);
  }
  for (auto& [dst, t] : plan) {
    if (t.dim() > 0 && t.size(0) < dst.size(0)) dst.narrow(0, t.size(0), dst.size(0) - t.size(0)).zero_();  // padded rows
    (t.dim() > 0 ? dst.narrow(0, 0, t.size(0)) : dst).copy_(t);
  }
}

GPTConfig infer_gpt_config(const Safetensors& st, GPTConfig c) {
  const at::Tensor* wte = lookup(st, "wte.weight");
  const at::Tensor* wpe = lookup(st, "wpe.weight");
  SYN_CHECK(wte && wpe && wte->dim() == 2 && wpe->dim() == 2, "weights have no 2-D wte/wpe tensors",
            "is this a GPT-2 safetensors file?");
  c.vocab_size = wte->size(0);
  c.n_embd = wte->size(1);
  c.block_size = wpe->size(0);
  int64_t layers = 0;
  while (lookup(st, fmt::format("h.{}.ln_1.weight", layers))) ++layers;
  c.n_layer = layers;
  c.qkv_bias = lookup(st, "h.0.attn.c_attn.bias") != nullptr;
  auto nh = st.metadata.find("syncopate.n_head");
  if (nh != st.metadata.end()) c.n_head = std::stoll(nh->second);
  if (c.n_embd % c.n_head != 0) c.n_head = std::max<int64_t>(1, c.n_embd / 64);
  return c;
}

std::map<std::string, std::string> hf_file_metadata(const GPTConfig& c) {
  return {{"format", "pt"}, {"syncopate.n_head", std::to_string(c.n_head)}, {"syncopate.vocab_size", std::to_string(c.vocab_size)}};
}

void save_model_safetensors(GPTImpl& model, const std::string& path) {
  save_safetensors(path, to_hf_tensors(model), hf_file_metadata(model.config()));
}

void load_model_safetensors(GPTImpl& model, const std::string& path) {
  load_hf_tensors(model, load_safetensors(path), path);
}

}  // namespace syncopate
