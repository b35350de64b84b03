#include "common/outer_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

OuterRule parse_outer_rule(const std::string& name) {
  if (name == "average") return OuterRule::kAverage;
  if (name == "nesterov") return OuterRule::kNesterov;
  if (name == "delayed_nesterov") return OuterRule::kDelayedNesterov;
  SYN_FAIL(fmt::format("dist.outer='{}' is not an outer optimizer", name), "use average, nesterov or delayed_nesterov");
}

OuterOptimizer::OuterOptimizer(OuterRule rule, double lr, double momentum, int64_t numel, const at::TensorOptions& options,
                               int64_t delay)
    : rule_(rule), lr_(lr), mu_(momentum), delay_(delay), m_(at::zeros({numel}, options)) {
  SYN_CHECK(delay >= 1, fmt::format("delayed Nesterov over {} arrivals", delay), "use dist.outer_delay >= 1 (0 = the nodes)");
  if (rule_ == OuterRule::kDelayedNesterov) acc_ = at::zeros({numel}, options);
}

void OuterOptimizer::set_delay(int64_t delay) {
  SYN_CHECK(delay >= 1, fmt::format("delayed Nesterov over {} arrivals", delay), "use dist.outer_delay >= 1 (0 = the nodes)");
  delay_ = delay;
}

double OuterOptimizer::step(at::Tensor& start, const at::Tensor& delta, at::Tensor& params) {
  double norm;
  if (rule_ == OuterRule::kAverage) {
    start.sub_(delta);
    norm = delta.norm().item<double>();
  } else if (rule_ == OuterRule::kDelayedNesterov) {
    acc_.add_(delta);
    at::Tensor step = delta.mul(lr_ / static_cast<double>(delay_));  // this arrival's share of the gradient term
    if (++pending_ >= delay_) {  // the N-th: momentum, once, on the mean (of more, if N fell meanwhile)
      m_.mul_(mu_).add_(acc_, 1.0 / static_cast<double>(pending_));
      step.add_(m_, lr_ * mu_);
      acc_.zero_();
      pending_ = 0;
    }
    start.sub_(step);
    norm = step.norm().item<double>();
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
