// RingSync (worker/sync/ring_sync.h).
#include "worker/sync/ring_sync.h"

#include <cmath>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/comm/local_group.h"
#include "common/comm/rendezvous.h"
#include "common/log.h"
#include "model/flat_parameters.h"
#include "worker/sync/bucket_reducer.h"

namespace syncopate {

RingSync::RingSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
    : GradientSync(s.local, s.local_size), group_(s.group), device_(s.device), nodes_(1), node_(0),
      clip_(s.optim.grad_clip), skip_(s.skip_grad_norm), node_clip_(s.dist.clip_scope == "node"),
      hierarchy_(parse_hierarchy(s.dist.hierarchy)),
      opt_(s.optim, flat.numel(), flat.decay_ranges(), flat.params.options()) {
  relink(s.ring);
  wire_.wire = parse_wire_format(s.dist.wire);
  wire_.segment_bytes = static_cast<size_t>(s.dist.segment_kb) << 10;
  if (s.dist.overlap && !node_clip_) {  // DDP's buckets (dist.first_bucket_kb, then dist.bucket_kb), summed as backward finishes each
    const auto ranges = parameter_ranges(flat);
    buckets_ = std::make_unique<BucketReducer>(
        params, ranges, flat.grads, bucket_bounds(ranges, s.dist.first_bucket_kb * 1024 / 4, s.dist.bucket_kb * 1024 / 4),
        device_, [this](int, at::Tensor bucket) { sum_->submit(bucket, wire_); }, [this] { sum_->drain(); });
    if (rank() == 0) log::info("[dist] {} gradient buckets, all-reduced during backward", buckets_->regions());
  }
}

RingSync::~RingSync() {
  buckets_.reset();  // its thread calls into sum_
  sum_.reset();
}

void RingSync::relink(std::shared_ptr<Ring> ring) {
  if (allreducer_) bytes_before_ += allreducer_->bytes_sent(), bytes_in_before_ += allreducer_->bytes_received();
  sum_.reset();
  allreducer_.reset();
  ring_ = std::move(ring);
  nodes_ = ring_ ? ring_->world : 1;
  node_ = ring_ ? ring_->rank : 0;
  if (nodes_ > 1 && rings(hierarchy_, local_))
    allreducer_ = std::make_unique<RingAllreducer>(ring_->rank, ring_->world, ring_->next_of(local_), ring_->prev_of(local_));
  sum_ = std::make_unique<NodeAllreduce>(group_.get(), local_, allreducer_.get(), nodes_, hierarchy_);
  if (buckets_) buckets_->recover();
}

void RingSync::sum_exact(at::Tensor& t) { sum_->sum(t, exact()); }

std::function<void(at::Tensor&)> RingSync::job_sum() {
  return [this](at::Tensor& t) {
    sum_->sum(t, exact());
    if (group_) group_->wait_device(local_, "the job's sum");  // bounded, before the host reads it
  };
}

void RingSync::share_ints(std::vector<int64_t>& v, bool source) {
  syncopate::share_ints(v, source, opt_.exp_avg().options(), [&](at::Tensor& t) {
    sum_->sum(t, exact());
    if (group_) group_->wait_device(local_, "the shared integers");  // bounded, before the host reads them
  });
}

// params <- rank 0's, exactly: x + 0 + ... + 0 == x. After a switch from another synchronization
// (worker/train/mode_switch.h: local SGD mid-round, ps), the replicas' weights and AdamW moments
// may differ: every replica takes the job's mean of both, and rank 0's step count, so that they
// stay identical from here on.
void RingSync::start(at::Tensor& params, int64_t) {
  if (!switched_) {
    if (rank() != 0) params.zero_();
    sum_->sum(params, exact());
    return;
  }
  for (at::Tensor* t : {&params, &opt_.exp_avg(), &opt_.exp_avg_sq()}) {
    sum_->sum(*t, exact());
    t->div_(world());
  }
  std::vector<int64_t> steps = {opt_.steps()};
  share_ints(steps, rank() == 0);
  opt_.set_steps(steps[0]);
}

void RingSync::begin_last_backward(double, int64_t) {
  mark_ = wire_bytes(), mark_in_ = wire_bytes_received();
  if (buckets_) buckets_->arm();
}

StepSync RingSync::finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t) {
  StepSync r;
  if (node_clip_) {
    r.grad_norm = clip_node_mean(grads);
    r.skipped = skip_update(clip_grad_norm(grads, 0), skip_);  // on the combined mean: every replica alike
  } else {
    if (!buckets_ || !buckets_->finish()) sum_->sum(grads, wire_);  // not reduced during backward: all at once
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
double RingSync::average(double x, bool* any) { return node_average(group_.get(), local_, local_size_, device_, x, any); }

void RingSync::check_identical(const at::Tensor& params, int64_t step) {
  check_replicas_identical(params, step, rank(), world(), local_size_, device_, [&](at::Tensor& t) { sum_->sum(t, exact()); });
}

void RingSync::set_release_gate(std::function<void(double)> gate) {
  if (buckets_) buckets_->set_gate(std::move(gate));
}

SyncCounters RingSync::counters() const {
  SyncCounters c;
  if (buckets_) c.regions = buckets_->regions(), c.launched_early = buckets_->launched_early(), c.reduced = buckets_->reduced();
  c.wire_bytes = wire_bytes();
  c.wire_bytes_received = wire_bytes_received();
  return c;
}

// clip_scope=node: grads <- the mean over nodes of each node's clipped mean gradient. Returns this
// node's norm before clipping. Every local replica holds the node's mean, so the job-wide sum
// counts each node local_size times.
double RingSync::clip_node_mean(at::Tensor& grads) {
  if (group_) {
    group_->all_reduce_sum(local_, grads);
    grads.div_(local_size_);
  }
  const double norm = clip_grad_norm(grads, clip_);
  sum_->sum(grads, wire_);
  grads.div_(world());
  return norm;
}

int64_t RingSync::wire_bytes() const { return bytes_before_ + (allreducer_ ? allreducer_->bytes_sent() : 0); }
int64_t RingSync::wire_bytes_received() const {
  return bytes_in_before_ + (allreducer_ ? allreducer_->bytes_received() : 0);
}

std::unique_ptr<GradientSync> make_ring_sync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params) {
  return std::make_unique<RingSync>(s, flat, params);
}

}  // namespace syncopate
