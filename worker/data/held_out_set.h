// The held-out set a run is evaluated on: `windows` (context+1)-token windows of the validation
// stream, chosen once by `seed` (eval.val_seed) and not by the run's training seed, so that every
// seed and every configuration of a study is scored on the very same tokens. digest() names the
// set (FNV-1a over its token ids and the context): two runs evaluated on the same set print the
// same digest, which the study tooling checks before it compares them.
#pragma once
#include <cstdint>
#include <string>

#include "worker/data/window_sampler.h"

namespace syncopate {

class HeldOutSet {
 public:
  // Throws syncopate::Error naming eval.val_windows when the validation stream holds fewer than
  // `windows` windows (each window is used at most once).
  HeldOutSet(const TokenStream& val, int64_t context, int64_t windows, uint64_t seed, int64_t vocab_limit);

  int64_t windows() const { return windows_; }
  int64_t context() const { return context_; }
  int64_t tokens() const { return windows_ * context_; }  // predicted tokens per evaluation
  const std::string& digest() const { return digest_; }   // 16 hex digits
  // Fills x, y ([count, context], row-major) with windows first..first+count-1 of the set.
  void fill(int64_t first, int64_t count, int64_t* x, int64_t* y) const;

 private:
  WindowSampler sampler_;  // epoch 0 of its permutation: distinct windows
  int64_t context_, windows_;
  std::string digest_;
};

}  // namespace syncopate
