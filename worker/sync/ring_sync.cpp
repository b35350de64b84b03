// RingSync: every replica of the job takes every step together. The gradient is summed over the
// node's local group and the ring of nodes (NodeAllreduce; a job of one node has no ring), bucket
// by bucket while backward runs (dist.overlap: DDP's buckets, cut by bucket_bounds; with several
// local replicas the buckets' in-node and ring stages pipelined, NodeAllreduce::submit) or as one
// buffer after it, divided by the world, clipped, and every replica applies the same AdamW step.
// dist.clip_scope=node clips each node's mean gradient before the nodes combine (what BSP parameter
// servers do), so the sum runs after backward: the node's mean, clipped, then the ring.
#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/comm/local_group.h"
#include "common/comm/node_allreduce.h"
#include "common/comm/rendezvous.h"
#include "common/comm/ring_allreduce.h"
#include "common/log.h"
#include "model/flat_parameters.h"
#include "worker/sync/bucket_reducer.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace {

class RingSync : public GradientSync {
 public:
  RingSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(s.local, s.local_size), ring_(s.ring), group_(s.group), device_(s.device),
        nodes_(ring_ ? ring_->world : 1), node_(ring_ ? ring_->rank : 0), clip_(s.optim.grad_clip), skip_(s.skip_grad_norm),
        node_clip_(s.dist.clip_scope == "node"),
        allreducer_(nodes_ > 1 && rings(parse_hierarchy(s.dist.hierarchy), s.local)
                        ? std::make_unique<RingAllreducer>(ring_->rank, ring_->world, ring_->next_of(s.local),
                                                           ring_->prev_of(s.local))
                        : nullptr),
        sum_(group_.get(), s.local, allreducer_.get(), nodes_, parse_hierarchy(s.dist.hierarchy)),
        opt_(s.optim, flat.numel(), flat.decay_ranges(), flat.params.options()) {
    wire_.wire = parse_wire_format(s.dist.wire);
    wire_.segment_bytes = static_cast<size_t>(s.dist.segment_kb) << 10;
    if (s.dist.overlap && !node_clip_) {  // DDP's buckets (dist.first_bucket_kb, then dist.bucket_kb), summed as backward finishes each
      const auto ranges = parameter_ranges(flat);
      buckets_ = std::make_unique<BucketReducer>(
          params, ranges, flat.grads, bucket_bounds(ranges, s.dist.first_bucket_kb * 1024 / 4, s.dist.bucket_kb * 1024 / 4),
          device_, [this](int, at::Tensor bucket) { sum_.submit(bucket, wire_); }, [this] { sum_.drain(); });
      if (rank() == 0) log::info("[dist] {} gradient buckets, all-reduced during backward", buckets_->regions());
    }
  }

  int rank() const override { return node_ * local_size_ + local_; }
  int world() const override { return nodes_ * local_size_; }
  int replicas_per_step() const override { return world(); }

  // params <- rank 0's, exactly: x + 0 + ... + 0 == x. After a switch from another synchronization
  // (worker/train/mode_switch.h: local SGD mid-round, ps), the replicas' weights and AdamW moments
  // may differ: every replica takes the job's mean of both, and rank 0's step count, so that they
  // stay identical from here on.
  void start(at::Tensor& params, int64_t) override {
    if (!switched_) {
      if (rank() != 0) params.zero_();
      sum_.sum(params, exact());
      return;
    }
    for (at::Tensor* t : {&params, &opt_.exp_avg(), &opt_.exp_avg_sq()}) {
      sum_.sum(*t, exact());
      t->div_(world());
    }
    at::Tensor steps = at::full({1}, rank() == 0 ? static_cast<float>(opt_.steps()) : 0.f, params.options());
    sum_.sum(steps, exact());
    if (group_) group_->wait_device(local_, "the step count");  // bounded, before the host reads it
    opt_.set_steps(static_cast<int64_t>(std::llround(steps.item<double>())));
  }
  void restart_state(const at::Tensor&) override { switched_ = true; }
  void begin_last_backward(double, int64_t) override {
    mark_ = wire_bytes(), mark_in_ = wire_bytes_received();
    if (buckets_) buckets_->arm();
  }
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t) override {
    StepSync r;
    if (node_clip_) {
      r.grad_norm = clip_node_mean(grads);
      r.skipped = skip_update(clip_grad_norm(grads, 0), skip_);  // on the combined mean: every replica alike
    } else {
      if (!buckets_ || !buckets_->finish()) sum_.sum(grads, wire_);  // not reduced during backward: all at once
      grads.div_(world());
      r.grad_norm = clip_grad_norm(grads, clip_);  // the same on every replica: they skip together
      r.skipped = skip_update(r.grad_norm, skip_);
    }
    if (!r.skipped) opt_.step(params, grads, lr);
    r.wire_bytes = wire_bytes() - mark_;
    r.wire_bytes_received = wire_bytes_received() - mark_in_;
    return r;
  }
  // The logged loss is the node's (its replicas' mean), as in every other mode: no collective across
  // nodes on the step's path that the other modes do not pay (issue 25); the job's mean is the mean
  // of the nodes' logs.
  double average(double x, bool* any) override { return node_average(group_.get(), local_, local_size_, device_, x, any); }
  void check_identical(const at::Tensor& params, int64_t step) override {
    check_replicas_identical(params, step, rank(), world(), local_size_, device_, [&](at::Tensor& t) { sum_.sum(t, exact()); });
  }
  FlatAdamW* optimizer() override { return &opt_; }
  void set_release_gate(std::function<void(double)> gate) override {
    if (buckets_) buckets_->set_gate(std::move(gate));
  }
  SyncCounters counters() const override {
    SyncCounters c;
    if (buckets_) c.regions = buckets_->regions(), c.launched_early = buckets_->launched_early(), c.reduced = buckets_->reduced();
    c.wire_bytes = wire_bytes();
    c.wire_bytes_received = wire_bytes_received();
    return c;
  }

 private:
  // clip_scope=node: grads <- the mean over nodes of each node's clipped mean gradient. Returns this
  // node's norm before clipping. Every local replica holds the node's mean, so the job-wide sum
  // counts each node local_size times.
  double clip_node_mean(at::Tensor& grads) {
    if (group_) {
      group_->all_reduce_sum(local_, grads);
      grads.div_(local_size_);
    }
    const double norm = clip_grad_norm(grads, clip_);
    sum_.sum(grads, wire_);
    grads.div_(world());
    return norm;
  }
  RingAllreduceOptions exact() const { return RingAllreduceOptions{wire_.segment_bytes, WireFormat::kF32}; }
  int64_t wire_bytes() const { return allreducer_ ? allreducer_->bytes_sent() : 0; }
  int64_t wire_bytes_received() const { return allreducer_ ? allreducer_->bytes_received() : 0; }

  std::shared_ptr<Ring> ring_;  // shared by the node's local replicas; replica l rings over lane l
  std::shared_ptr<LocalGroup> group_;  // null: one local replica
  int device_, nodes_, node_;
  double clip_, skip_;
  bool node_clip_;  // dist.clip_scope=node
  std::unique_ptr<RingAllreducer> allreducer_;  // one sender thread and buffer set for every collective
  NodeAllreduce sum_;
  RingAllreduceOptions wire_;
  FlatAdamW opt_;
  std::unique_ptr<BucketReducer> buckets_;  // dist.overlap: reductions during backward
  int64_t mark_ = 0, mark_in_ = 0;  // wire bytes sent and received before this step's last backward
  bool switched_ = false;  // resumed from another synchronization's checkpoint (restart_state)
};

}  // namespace

std::unique_ptr<GradientSync> make_ring_sync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params) {
  return std::make_unique<RingSync>(s, flat, params);
}

}  // namespace syncopate
