// Deterministic sampling of (context+1)-token windows from a token file.
//
// Sample k (a global counter over the whole run) starts at offset splitmix64(seed, k) mod
// (tokens - context). A step of R replicas x M micro-batches x b sequences consumes samples
// [step*R*M*b, (step+1)*R*M*b); micro-batch m of replica r takes [((step*M + m)*R + r)*b, +b).
// So R replicas with batch b see exactly the samples one process with batch R*b sees, each a
// disjoint slice, and the data position is just the step number.
#pragma once
#include <cstdint>

#include "worker/token_file.h"

namespace syncopate {

class WindowSampler {
 public:
  WindowSampler(const TokenFile& file, int64_t context, uint64_t seed)
      : file_(file), context_(context), seed_(seed) {}

  // Start offset of global sample k.
  int64_t offset(int64_t k) const;
  // Fills x and y ([count, context] int64, row-major) with samples first..first+count-1;
  // y is x shifted by one token.
  void fill(int64_t first, int64_t count, int64_t* x, int64_t* y) const;
  // First global sample index of micro-batch `micro` of `replica` at optimizer step `step`.
  static int64_t first_sample(int64_t step, int64_t micro, int64_t micro_steps, int64_t replica,
                              int64_t replicas, int64_t batch) {
    return ((step * micro_steps + micro) * replicas + replica) * batch;
  }

 private:
  const TokenFile& file_;
  int64_t context_;
  uint64_t seed_;
};

}  // namespace syncopate
