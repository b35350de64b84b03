// RAII switch for bf16 autocast on CUDA (mixed precision: fp32 master weights, bf16 matmuls).
// Hides the LibTorch API change between 1.13-2.3 and 2.4+. Disabled = does nothing.
// Inside it the cache of weight casts is off for this thread (issue 28 (1)): LibTorch keeps one
// process-wide cache of bf16 casts of fp32 leaf weights, cleared when any thread's autocast
// nesting returns to 0 and never checked against in-place updates, so with several replica
// threads one replica's guard would clear every replica's casts on every forward, and an entry
// outliving an optimizer step would serve old weights. Each weight is used once per forward in
// this model, so the cache saves nothing here; the nesting count and the clear on leaving stay,
// as torch.utils.checkpoint keeps them.
#pragma once
#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace syncopate {

class AutocastGuard {
 public:
  explicit AutocastGuard(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    prev_ = at::autocast::is_autocast_enabled(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
#else
    prev_ = at::autocast::is_enabled();
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
#endif
    prev_cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_cache_enabled(prev_cache_);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, prev_);
#else
    at::autocast::set_enabled(prev_);
#endif
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  bool prev_ = false;
  bool prev_cache_ = true;
};

}  // namespace syncopate
