#include "model/flat_parameters.h"

#include <torch/torch.h>

namespace syncopate {

FlatParameters::FlatParameters(torch::nn::Module& module) {
  auto named = module.named_parameters(/*recurse=*/true);
  int64_t total = 0;
  for (const auto& kv : named) total += kv.value().numel();
  auto opts = named.size() ? named[0].value().options() : torch::TensorOptions();
  params = torch::empty({total}, opts.dtype(torch::kFloat));
  grads = torch::zeros({total}, opts.dtype(torch::kFloat));
  torch::NoGradGuard no_grad;
  int64_t off = 0;
  for (auto& kv : named) {
    auto& p = kv.value();
    const int64_t n = p.numel();
    params.narrow(0, off, n).copy_(p.detach().reshape({-1}));
    p.set_data(params.narrow(0, off, n).view(p.sizes()));
    p.mutable_grad() = grads.narrow(0, off, n).view(p.sizes());
    segments.push_back({kv.key(), off, n, p.sizes().vec(), p.dim() >= 2});
    off += n;
  }
}

std::vector<std::pair<int64_t, int64_t>> FlatParameters::decay_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (const auto& s : segments) {
    if (!s.decay) continue;
    if (!r.empty() && r.back().first + r.back().second == s.offset) r.back().second += s.numel;
    else r.emplace_back(s.offset, s.numel);
  }
  return r;
}

}  // namespace syncopate
