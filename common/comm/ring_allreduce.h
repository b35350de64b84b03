// Ring all-reduce (sum) of a float32 buffer, bandwidth-optimal: reduce-scatter, then all-gather.
//
// Steps: the buffer is cut into n chunks (Sharding: chunk c is [S*c/n, S*(c+1)/n)). In
// reduce-scatter step s (s = 0..n-2) rank r sends
// chunk (r-s) mod n to the next rank and adds the received chunk (r-s-1) mod n into its own; after
// n-1 steps rank r holds the full sum of chunk (r+1) mod n. In all-gather step s it sends chunk
// (r+1-s) mod n and stores the received chunk (r-s) mod n.
// Bytes on the wire: each rank sends and receives 2(n-1)/n * S for a buffer of S bytes, the lower
// bound for ring algorithms; 2(n-1) latency hops.
// Pipelining: chunks travel in segments; a dedicated sender thread streams segments to `next`
// while the calling thread receives from `prev` and reduces, and a segment is queued for sending
// the moment it is reduced. Sending, receiving and adding overlap, and both directions of every
// link are busy at once (full duplex).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/comm/transport/connection.h"
#include "common/comm/wire_format.h"

namespace syncopate {

struct RingAllreduceOptions {
  size_t segment_bytes = 256 << 10;  // pipelining granularity, bytes; smaller = earlier overlap, more calls
  WireFormat wire = WireFormat::kF32;  // f32, or bf16 / fp16 (half the bytes; ~3 significant digits per hop); not int8
};

// The ring all-reduce of one rank over one pair of links, with its receive buffers and its sender
// thread made once and reused by every call (a training step reduces many buckets). Calls must
// not overlap. After a failed call (a peer died) every later call rethrows that failure.
class RingAllreducer {
 public:
  RingAllreducer(int rank, int world, Connection& next, Connection& prev);
  ~RingAllreducer();
  // Sums data[0..count) across the ranks in place; see ring_allreduce_sum.
  void sum(float* data, size_t count, const RingAllreduceOptions& opt = {});
  // Bytes sent to `next` / received from `prev` by every call so far (2(n-1)/n of each buffer, in
  // the wire's format).
  int64_t bytes_sent() const;
  int64_t bytes_received() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sums `data[0..count)` across `world` ranks in place (a RingAllreducer for one call); every rank passes the same count. `next`
// is the connection to rank (rank+1) mod world (send side), `prev` the one from (rank-1) mod world
// (receive side). world == 1 or count == 0 returns at once. Throws syncopate::Error naming the
// peer on a lost or stalled connection.
void ring_allreduce_sum(float* data, size_t count, int rank, int world, Connection& next, Connection& prev,
                        const RingAllreduceOptions& opt = {});

// The obviously correct reference: every rank sends its whole buffer around the ring (n-1 hops)
// and adds what it receives. (n-1) * S bytes per rank; used by tests to check the fast path.
void naive_allreduce_sum(float* data, size_t count, int rank, int world, Connection& next, Connection& prev);

}  // namespace syncopate
