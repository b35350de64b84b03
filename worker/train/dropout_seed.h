// The dropout seed of one micro-batch of one replica: a hash of (seed, global rank, step, micro)
// alone, so that replicas draw different masks and a resumed run draws what the uninterrupted one
// drew, with no generator state to save. The trainer and the simulator (experiments/sim) share it.
#pragma once
#include <cstdint>

#include "common/splitmix64.h"

namespace syncopate {

inline uint64_t dropout_seed(int64_t seed, int rank, int64_t step, int64_t micro) {
  uint64_t h = splitmix64(static_cast<uint64_t>(seed) ^ 0xd50u);
  for (uint64_t x : {static_cast<uint64_t>(rank), static_cast<uint64_t>(step), static_cast<uint64_t>(micro)}) h = splitmix64(h + x);
  return h;
}

}  // namespace syncopate
