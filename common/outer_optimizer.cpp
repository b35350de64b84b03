#include "common/outer_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

OuterRule parse_outer_rule(const std::string& name) {
  if (name == "average") return OuterRule::kAverage;
  if (name == "nesterov") return OuterRule::kNesterov;
  SYN_FAIL(fmt::format("dist.outer='{}' is not an outer optimizer", name), "use average or nesterov");
}

OuterOptimizer::OuterOptimizer(OuterRule rule, double lr, double momentum, int64_t numel, const at::TensorOptions& options)
    : rule_(rule), lr_(lr), mu_(momentum), m_(at::zeros({numel}, options)) {}

double OuterOptimizer::step(at::Tensor& start, const at::Tensor& delta, at::Tensor& params) {
  double norm;
  if (rule_ == OuterRule::kAverage) {
    start.sub_(delta);
    norm = delta.norm().item<double>();
  } else {
    m_.mul_(mu_).add_(delta);                      // m <- mu m + Delta
    const at::Tensor step = delta.add(m_, mu_);    // Delta + mu m, made once
    start.sub_(step, lr_);                         // theta <- theta_start - lr (Delta + mu m)
    norm = lr_ * step.norm().item<double>();
  }
  if (!params.is_same(start)) params.copy_(start);
  return norm;
}

}  // namespace syncopate
