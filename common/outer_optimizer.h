// The outer step of local SGD / DiLoCo (Douillard et al. 2023): every `sync_every` inner steps the
// replicas' pseudo-gradients Delta = theta_start - theta_now are averaged and applied to the
// round's starting point theta_start by an outer optimizer:
//   average   theta <- theta_start - Delta                      (local SGD: the replicas' mean)
//   nesterov  m <- mu * m + Delta;  theta <- theta_start - lr * (Delta + mu * m)
//             (torch.optim.SGD(nesterov=True, dampening=0); DiLoCo's lr 0.7, mu 0.9)
//   delayed_nesterov (asynchronous arrivals, after Liu et al. 2024's delayed Nesterov): each
//             arrival applies theta <- theta - (lr / N) * Delta and is accumulated; every N-th
//             arrival also updates the momentum once with the mean of the N, m <- mu * m + mean,
//             and applies theta <- theta - lr * mu * m. Over N arrivals that is exactly one
//             Nesterov step on their mean, with momentum that moves N times less often than
//             arrivals come (per-arrival Nesterov compounds stale momentum and diverges).
// Used by the ring (every node applies the same step) and by parameter-server shards (each on its
// range). Over flat fp32 buffers; no torch/torch.h.
#pragma once
#include <string>

#include <ATen/core/Tensor.h>

namespace syncopate {

enum class OuterRule { kAverage, kNesterov, kDelayedNesterov };
// "average", "nesterov" or "delayed_nesterov"; anything else is an error naming them.
OuterRule parse_outer_rule(const std::string& name);

class OuterOptimizer {
 public:
  // delay: delayed_nesterov's N (arrivals per momentum update, >= 1); ignored by the others.
  OuterOptimizer(OuterRule rule, double lr, double momentum, int64_t numel, const at::TensorOptions& options,
                 int64_t delay = 1);
  // start: theta_start of the round (updated in place to the new theta); delta: the mean
  // pseudo-gradient. Writes the new theta into `params` as well. Returns ||new - old start||.
  double step(at::Tensor& start, const at::Tensor& delta, at::Tensor& params);
  at::Tensor& momentum() { return m_; }  // checkpointed with the round's start
  // delayed_nesterov: the arrivals accumulated since the last momentum update (checkpointed too).
  at::Tensor& accumulated() { return acc_; }
  int64_t pending() const { return pending_; }
  void set_pending(int64_t n) { pending_ = n; }
  // delayed_nesterov: N from the next arrival on (an elastic job's live members, >= 1). Arrivals already
  // accumulated count toward it; if they reach it, the next arrival applies the momentum on their mean.
  void set_delay(int64_t delay);
  int64_t delay() const { return delay_; }

 private:
  OuterRule rule_;
  double lr_, mu_;
  int64_t delay_;
  at::Tensor m_, acc_;
  int64_t pending_ = 0;
};

}  // namespace syncopate
