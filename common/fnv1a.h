// 64-bit FNV-1a: a small, stable (across processes and machines) hash for digests that travel
// between nodes: the job-token digest and the config fingerprint.
#pragma once
#include <cstdint>
#include <string_view>

namespace syncopate {

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

}  // namespace syncopate
