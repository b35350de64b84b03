#include "worker/data/window_sampler.h"

#include <vector>

#include "common/check.h"
#include "common/splitmix64.h"

namespace syncopate {

int64_t permute(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int half = 1;  // the Feistel domain is 2^(2*half) >= n
  while ((uint64_t{1} << (2 * half)) < static_cast<uint64_t>(n)) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(i);
  do {  // cycle-walk: the domain is < 4n, so this ends after fewer than 4 rounds on average
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(key ^ (round << 56) ^ r) & mask;
      const uint64_t t = l ^ f;
      l = r;
      r = t;
    }
    x = (l << half) | r;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

WindowSampler::WindowSampler(const TokenStream& stream, int64_t context, uint64_t seed, int64_t vocab_limit)
    : stream_(stream), context_(context), windows_((stream.size() - 1) / context), seed_(seed), vocab_limit_(vocab_limit) {
  SYN_CHECK(windows_ >= 1,
            fmt::format("'{}' holds {} tokens, fewer than one window of {} tokens", stream.path(), stream.size(),
                        context + 1),
            "use a larger corpus or a shorter model.block_size");
}

int64_t WindowSampler::offset(int64_t k) const {
  const int64_t e = k / windows_;
  const uint64_t key = splitmix64(splitmix64(seed_) ^ static_cast<uint64_t>(e));
  return permute(k % windows_, windows_, key) * context_;
}

void WindowSampler::fill(int64_t first, int64_t count, int64_t* x, int64_t* y) const {
  thread_local std::vector<int64_t> w;
  w.resize(static_cast<size_t>(context_ + 1));
  for (int64_t i = 0; i < count; ++i) {
    stream_.copy(offset(first + i), context_ + 1, w.data());
    for (int64_t t = 0; t <= context_; ++t)
      SYN_CHECK(w[static_cast<size_t>(t)] >= 0 && w[static_cast<size_t>(t)] < vocab_limit_,
                fmt::format("'{}' holds token id {} but the model's vocabulary has {} ids", stream_.path(),
                            w[static_cast<size_t>(t)], vocab_limit_),
                "set model.vocab_size to the tokenizer's vocabulary (gpt2-bpe: 50257) or use matching data");
    std::copy(w.begin(), w.end() - 1, x + i * context_);
    std::copy(w.begin() + 1, w.end(), y + i * context_);
  }
}

}  // namespace syncopate
