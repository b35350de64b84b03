// RingSync: every replica of the job takes every step together. The gradient is summed over the
// node's local group and the ring of nodes (NodeAllreduce; a job of one node has no ring), bucket
// by bucket while backward runs (dist.overlap: DDP's buckets, cut by bucket_bounds; with several
// local replicas the buckets' in-node and ring stages pipelined, NodeAllreduce::submit) or as one
// buffer after it, divided by the world, clipped, and every replica applies the same AdamW step.
// dist.clip_scope=node clips each node's mean gradient before the nodes combine (what BSP parameter
// servers do), so the sum runs after backward: the node's mean, clipped, then the ring.
// Declared here for the elastic ring (elastic_ring_sync.cpp), which moves it onto each new ring
// of its membership (relink); everything else makes it through make_ring_sync.
#pragma once
#include <memory>

#include "common/comm/node_allreduce.h"
#include "common/comm/ring_allreduce.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
class BucketReducer;

class RingSync : public GradientSync {
 public:
  RingSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params);
  ~RingSync() override;

  int rank() const override { return node_ * local_size_ + local_; }
  int world() const override { return nodes_ * local_size_; }
  int replicas_per_step() const override { return world(); }
  void start(at::Tensor& params, int64_t step) override;
  void restart_state(const at::Tensor&) override { switched_ = true; }
  void begin_last_backward(double lr, int64_t step) override;
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override;
  double average(double x, bool* any) override;
  void check_identical(const at::Tensor& params, int64_t step) override;
  std::function<void(at::Tensor&)> job_sum() override;
  FlatAdamW* optimizer() override { return &opt_; }
  void set_release_gate(std::function<void(double)> gate) override;
  SyncCounters counters() const override;

  // The elastic ring: from here on the job is the nodes of `ring` (null: this node alone). The
  // collectives in place are dropped (after a failed one: its threads and broken state with them);
  // the optimizer state and the buckets stay. Wire byte counts carry on.
  void relink(std::shared_ptr<Ring> ring);
  // t <- the sum of t over every replica, exactly (float32 on the wire).
  void sum_exact(at::Tensor& t);
  // Every replica ends with the source replica's non-negative integers (exactly, in 22-bit pieces
  // through one float32 sum); exactly one replica passes source = true, the others their own
  // vector's size.
  void share_ints(std::vector<int64_t>& v, bool source);

 private:
  double clip_node_mean(at::Tensor& grads);
  RingAllreduceOptions exact() const { return RingAllreduceOptions{wire_.segment_bytes, WireFormat::kF32}; }
  int64_t wire_bytes() const;
  int64_t wire_bytes_received() const;

  std::shared_ptr<Ring> ring_;  // shared by the node's local replicas; replica l rings over lane l
  std::shared_ptr<LocalGroup> group_;  // null: one local replica
  int device_, nodes_, node_;
  double clip_, skip_;
  bool node_clip_;  // dist.clip_scope=node
  Hierarchy hierarchy_;
  std::unique_ptr<RingAllreducer> allreducer_;  // one sender thread and buffer set for every collective
  std::unique_ptr<NodeAllreduce> sum_;          // (holds allreducer_: goes first)
  int64_t bytes_before_ = 0, bytes_in_before_ = 0;  // wire bytes of the allreducers before a relink
  RingAllreduceOptions wire_;
  FlatAdamW opt_;
  std::unique_ptr<BucketReducer> buckets_;  // dist.overlap: reductions during backward
  int64_t mark_ = 0, mark_in_ = 0;  // wire bytes sent and received before this step's last backward
  bool switched_ = false;  // resumed from another synchronization's checkpoint (restart_state)
};

}  // namespace syncopate
