// The sum of a float32 buffer over every replica of the job, hierarchically:
//   1. reduce-scatter inside the node (NCCL on GPUs, threads on CPU): local rank l ends with the
//      node's sum of slice l;
//   2. local rank l ring-all-reduces its slice with local rank l of every other node, over its
//      own ring lane (its own TCP connections): L rings run in parallel, each carrying 1/L;
//   3. all-gather inside the node.
// Between nodes each node sends 2(n-1)/n * S bytes in all, as a flat ring would, but the work of
// reducing is spread over L threads and L connections. One node: steps 1-3 become one local
// all-reduce. One local replica: only the ring.
// Hierarchy::kRoot is the simpler scheme: reduce to local replica 0, which alone rings the whole
// buffer (over lane 0), then broadcast inside the node. It stays a user choice
// (dist.hierarchy=root) because it is the readable reference the sliced path is checked against
// (tests run both against one process) and the baseline bench_allreduce.sh measures it against.
//
// Pipelined (issue 28 (4)): submit() and drain() sum a sequence of buffers (the gradient
// buckets) with the three stages overlapped across buffers, as Horovod's and BytePS's
// hierarchical paths do: bucket k crosses the network on this replica's ring thread while the
// caller reduce-scatters bucket k+1 and all-gathers bucket k-1 inside the node. sum() is the
// serial reference they are checked against (same values, bit for bit).
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "common/comm/host_staging.h"
#include "common/comm/ring_allreduce.h"

namespace syncopate {
class LocalGroup;

enum class Hierarchy { kSliced, kRoot };

class NodeAllreduce {
 public:
  // group: null when the node has one replica; nodes: nodes in the job; lane: this replica's
  // ring lane, null when nodes == 1 (and, with kRoot, on every local replica but 0).
  NodeAllreduce(LocalGroup* group, int local_rank, RingAllreducer* lane, int nodes, Hierarchy h = Hierarchy::kSliced);
  ~NodeAllreduce();  // joins the ring thread (after the sum under way, if any)
  NodeAllreduce(const NodeAllreduce&) = delete;
  NodeAllreduce& operator=(const NodeAllreduce&) = delete;

  // t <- sum of t over all replicas (in place); t is a contiguous 1-D float32 buffer (a view of a
  // larger one is fine) on this replica's device. Identical on every replica. Calls must not overlap.
  void sum(at::Tensor t, const RingAllreduceOptions& opt) const;

  // The same sum, pipelined: submit(t) returns once t's reduce-scatter is done and its slice is
  // queued for the ring; t's all-gather is issued at the next submit() (after that buffer's
  // reduce-scatter) or at drain(), which returns once every submitted t holds its sum. So every
  // local replica issues its in-node collectives in one order (RS 0, RS 1, AG 0, RS 2, AG 1, ...,
  // AG last) whatever the ring's timing. A submitted t must not be touched until drain() returns;
  // one thread calls submit/drain, never interleaved with sum(). A ring failure is rethrown by the
  // next submit() or drain(). Without a ring slice to overlap (one node, one local replica, or the
  // root hierarchy) submit(t) is sum(t).
  void submit(at::Tensor t, const RingAllreduceOptions& opt);
  void drain();
  // After any of sum/submit/drain failed midway, this replica's in-node collectives are out of step
  // with the other replicas': every later call throws at once, issuing nothing.

 private:
  struct Pipeline;
  template <class F>
  void guarded(F&& f) const;
  void sum_unguarded(at::Tensor t, const RingAllreduceOptions& opt) const;
  void submit_unguarded(at::Tensor t, const RingAllreduceOptions& opt);
  void drain_unguarded();
  void ring_sum(RingAllreducer& lane, at::Tensor t, const RingAllreduceOptions& opt) const;
  at::Tensor own_slice(const at::Tensor& t) const;
  mutable HostStaging staging_;  // GPU replicas: host memory for the ring
  std::unique_ptr<Pipeline> pipe_;  // submit/drain: the ring thread and the buffers in flight
  mutable bool broken_ = false;     // a call failed midway (see above)
  LocalGroup* group_;
  int local_rank_;
  RingAllreducer* lane_;
  int nodes_;
  Hierarchy hierarchy_;
};

// "sliced" or "root" (dist.hierarchy); anything else is an error naming the choices.
Hierarchy parse_hierarchy(const std::string& name);

// Ring lanes a node of `local` replicas opens to its neighbours (RendezvousOptions::lanes), and
// whether local replica l rings over one (lane l): every replica when sliced, replica 0 for root.
inline int ring_lanes(Hierarchy h, int local) { return h == Hierarchy::kSliced ? local : 1; }
inline bool rings(Hierarchy h, int local_rank) { return h == Hierarchy::kSliced || local_rank == 0; }

}  // namespace syncopate
