#include "worker/sync/gradient_readiness.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace syncopate {

struct GradientReadiness::State {
  std::mutex mu;
  bool armed = false;
  std::vector<std::vector<int>> regions_of;  // parameter -> regions it overlaps
  std::vector<int> params_in;                // region -> parameters overlapping it
  std::vector<int> left;                     // region -> parameters not yet final in this backward
  std::vector<bool> fired;
  std::function<void(int)> ready;
  std::vector<decltype(torch::autograd::impl::grad_accumulator(at::Tensor()))> accumulators;  // keeps the hooks alive
};

GradientReadiness::GradientReadiness(const std::vector<at::Tensor>& params,
                                     const std::vector<std::pair<int64_t, int64_t>>& ranges, std::vector<int64_t> bounds,
                                     std::function<void(int)> ready)
    : state_(std::make_shared<State>()) {
  auto& s = *state_;
  const int R = static_cast<int>(bounds.size()) - 1;
  s.ready = std::move(ready);
  s.params_in.assign(static_cast<size_t>(R), 0);
  s.regions_of.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t lo = ranges[i].first, hi = ranges[i].first + ranges[i].second;
    for (int r = 0; r < R; ++r)
      if (lo < bounds[r + 1] && hi > bounds[r] && hi > lo) s.regions_of[i].push_back(r), ++s.params_in[r];
    std::weak_ptr<State> weak = state_;
    const auto& mine = s.regions_of[i];
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, mine](const torch::autograd::variable_list& out, const torch::autograd::variable_list&) {
          auto st = weak.lock();
          if (!st) return out;
          std::vector<int> now;
          {
            std::lock_guard<std::mutex> l(st->mu);
            if (!st->armed) return out;
            for (int r : mine)
              if (--st->left[r] == 0 && !st->fired[r]) st->fired[r] = true, now.push_back(r);
          }
          for (int r : now) st->ready(r);
          return out;
        }));
    s.accumulators.push_back(std::move(acc));
  }
  s.left = s.params_in;
  s.fired.assign(static_cast<size_t>(R), false);
}

GradientReadiness::~GradientReadiness() { disarm(); }

void GradientReadiness::arm() {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->armed = true;
  state_->left = state_->params_in;
  state_->fired.assign(state_->fired.size(), false);
}

void GradientReadiness::disarm() {
  std::lock_guard<std::mutex> l(state_->mu);
  state_->armed = false;
}

}  // namespace syncopate
