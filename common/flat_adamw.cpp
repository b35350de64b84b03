#include "common/flat_adamw.h"

#include <cmath>

#include <ATen/ATen.h>

#include "common/check.h"

namespace syncopate {

FlatAdamW::FlatAdamW(const AdamWConfig& cfg, int64_t numel, std::vector<std::pair<int64_t, int64_t>> decay_ranges,
                     const at::TensorOptions& options)
    : cfg_(cfg), decay_(std::move(decay_ranges)) {
  auto o = options.dtype(at::kFloat);
  m_ = at::zeros({numel}, o);
  v_ = at::zeros({numel}, o);
  denom_ = at::empty({numel}, o);
  for (auto& [off, len] : decay_)
    SYN_CHECK(off >= 0 && len >= 0 && off + len <= numel, "weight-decay range outside the parameter buffer",
              "this is a bug: report it with the model config");
}

void FlatAdamW::step(at::Tensor& p, const at::Tensor& g, double lr) {
  ++step_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(step_));
  if (cfg_.weight_decay != 0.0)
    for (auto& [off, len] : decay_) p.narrow(0, off, len).mul_(1.0 - lr * cfg_.weight_decay);
  // beta1*m + (1-beta1)*g, not lerp's m + (1-beta1)*(g - m): g - m overflows for finite g and m
  // of opposite sign near the float range (+3.4e38 then -3.4e38), and the parameters became NaN.
  m_.mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
  v_.mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
  at::sqrt_out(denom_, v_);
  denom_.div_(std::sqrt(bc2)).add_(cfg_.eps);
  p.addcdiv_(m_, denom_, -lr / bc1);
}

double clip_grad_norm(at::Tensor& grads, double max_norm) {
  const double norm = grads.norm().item<double>();
  if (max_norm > 0 && norm > max_norm) grads.mul_(max_norm / (norm + 1e-6));
  return norm;
}

}  // namespace syncopate
