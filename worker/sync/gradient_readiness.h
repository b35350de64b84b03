// Tells when each region of the flat gradient buffer holds this backward's final values.
//
// The buffer [0, numel) is cut into contiguous regions by `bounds`. A post-hook on every
// parameter's AccumulateGrad node counts the parameters of each region that are final; when the
// last parameter overlapping region r is, `ready(r)` runs (on the autograd thread, during
// backward). Only backwards after arm() count, each region fires at most once per arm(), so with
// gradient accumulation only the last micro-batch triggers it. Regions whose parameters receive
// no gradient never fire: callers handle the rest after backward, then disarm().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace syncopate {

class GradientReadiness {
 public:
  // params[i] occupies ranges[i] = (offset, numel) of the flat buffer; bounds = {0, b1, ..., numel}.
  GradientReadiness(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                    std::vector<int64_t> bounds, std::function<void(int)> ready);
  ~GradientReadiness();
  void arm();
  // Backward is over: later backwards (the next step's first micro-batches) fire nothing.
  void disarm();

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the hooks, which may outlive this object
};

}  // namespace syncopate
