#include "worker/window_sampler.h"

namespace syncopate {
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

int64_t WindowSampler::offset(int64_t k) const {
  const uint64_t range = static_cast<uint64_t>(file_.size() - context_);  // >= 1: checked at open
  return static_cast<int64_t>(splitmix64(splitmix64(seed_) ^ static_cast<uint64_t>(k)) % range);
}

void WindowSampler::fill(int64_t first, int64_t count, int64_t* x, int64_t* y) const {
  const uint16_t* d = file_.data();
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t* w = d + offset(first + i);
    int64_t* xr = x + i * context_;
    int64_t* yr = y + i * context_;
    for (int64_t t = 0; t < context_; ++t) {
      xr[t] = w[t];
      yr[t] = w[t + 1];
    }
  }
}

}  // namespace syncopate
