// The outer step of local SGD / DiLoCo (Douillard et al. 2023): every `sync_every` inner steps the
// replicas' pseudo-gradients Delta = theta_start - theta_now are averaged and applied to the
// round's starting point theta_start by an outer optimizer:
//   average   theta <- theta_start - Delta                      (local SGD: the replicas' mean)
//   nesterov  m <- mu * m + Delta;  theta <- theta_start - lr * (Delta + mu * m)
//             (torch.optim.SGD(nesterov=True, dampening=0); DiLoCo's lr 0.7, mu 0.9)
// Used by the ring (every node applies the same step) and by parameter-server shards (each on its
// range). Over flat fp32 buffers; no torch/torch.h.
#pragma once
#include <string>

#include <ATen/core/Tensor.h>

namespace syncopate {

enum class OuterRule { kAverage, kNesterov };
// "average" or "nesterov"; anything else is an error naming both.
OuterRule parse_outer_rule(const std::string& name);

class OuterOptimizer {
 public:
  OuterOptimizer(OuterRule rule, double lr, double momentum, int64_t numel, const at::TensorOptions& options);
  // start: theta_start of the round (updated in place to the new theta); delta: the mean
  // pseudo-gradient. Writes the new theta into `params` as well. Returns ||new - old start||.
  double step(at::Tensor& start, const at::Tensor& delta, at::Tensor& params);
  at::Tensor& momentum() { return m_; }  // checkpointed with the round's start

 private:
  OuterRule rule_;
  double lr_, mu_;
  at::Tensor m_;
};

}  // namespace syncopate
