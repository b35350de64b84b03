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
  if (rule_ == OuterRule::kAverage) {
    start.sub_(delta);
  } else {
    m_.mul_(mu_).add_(delta);                      // m <- mu m + Delta
    start.sub_(delta.add(m_, mu_), lr_);           // theta <- theta_start - lr (Delta + mu m)
  }
  if (!params.is_same(start)) params.copy_(start);
  return (rule_ == OuterRule::kAverage ? delta.norm() : delta.add(m_, mu_).mul(lr_).norm()).item<double>();
}

}  // namespace syncopate
