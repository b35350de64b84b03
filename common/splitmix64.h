// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed 64-bit hash, stable across machines.
// Used wherever data order must follow from a seed alone (the window sampler, the train/valid
// split of syncopate-data).
#pragma once
#include <cstdint>

namespace syncopate {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace syncopate
