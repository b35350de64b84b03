// The one partition rule of the code base: a buffer of n elements cut into `parts` contiguous
// pieces, piece i being [n*i/parts, n*(i+1)/parts). Pieces differ in length by at most one
// element and depend only on (n, parts), so every replica, every node and every server computes
// the same cut. Used for the ring's chunks, the node's slices (reduce-scatter / all-gather) and
// the parameter servers' shards.
#pragma once
#include <cstdint>
#include <vector>

namespace syncopate {

struct Sharding {
  // First element of piece i (i = parts gives n).
  static int64_t begin(int64_t n, int parts, int i) { return n * i / parts; }
  // The parts + 1 ascending boundaries: piece i is [b[i], b[i+1]).
  static std::vector<int64_t> bounds(int64_t n, int parts) {
    std::vector<int64_t> b;
    b.reserve(static_cast<size_t>(parts) + 1);
    for (int i = 0; i <= parts; ++i) b.push_back(begin(n, parts, i));
    return b;
  }
};

}  // namespace syncopate
