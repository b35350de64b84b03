// Deterministic sampling of (context+1)-token windows from a token stream, across document
// boundaries as GPT pretraining does.
//
// The stream is cut into W = (tokens - 1) / context windows; window w covers tokens
// [w*context, w*context + context], so consecutive windows share one token (the last target of
// one is the first input of the next). Global sample k belongs to epoch e = k / W and is window
// perm_e(k mod W), where perm_e is a pseudo-random permutation of 0..W-1 drawn from (seed, e):
// every epoch visits every window exactly once, in a new order, and sample k is computable on its
// own (no shuffled index in memory, nothing to rebuild on resume).
//
// A step of R replicas x M micro-batches x b sequences consumes samples [p, p + R*M*b), where p,
// the data position, is the count of samples consumed before it; micro-batch m of replica r takes
// [p + (m*R + r)*b, +b). So R replicas with batch b see exactly the samples one process with batch
// R*b sees, each a disjoint slice. Checkpoints store p.
#pragma once
#include <cstdint>

#include "worker/data/token_stream.h"

namespace syncopate {

class WindowSampler {
 public:
  // Throws syncopate::Error when the stream holds less than one window. Ids must be < vocab_limit.
  WindowSampler(const TokenStream& stream, int64_t context, uint64_t seed, int64_t vocab_limit);

  int64_t windows() const { return windows_; }  // samples per epoch
  int64_t epoch(int64_t k) const { return k / windows_; }
  // Start offset of global sample k.
  int64_t offset(int64_t k) const;
  // Fills x and y ([count, context] int64, row-major) with samples first..first+count-1;
  // y is x shifted by one token. Throws if a token id is >= vocab_limit.
  void fill(int64_t first, int64_t count, int64_t* x, int64_t* y) const;
  // First global sample of micro-batch `micro` of `replica`, for a step starting at data position p.
  static int64_t first_sample(int64_t p, int64_t micro, int64_t replica, int64_t replicas, int64_t batch) {
    return p + (micro * replicas + replica) * batch;
  }

 private:
  const TokenStream& stream_;
  int64_t context_, windows_;
  uint64_t seed_;
  int64_t vocab_limit_;
};

// A keyed pseudo-random permutation of 0..n-1 (a 4-round Feistel network on the next power of
// four, cycle-walking back into range): permute(i) is a bijection for every key.
int64_t permute(int64_t i, int64_t n, uint64_t key);

}  // namespace syncopate
