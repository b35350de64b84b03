#include "worker/replicas.h"

#include <algorithm>

#include <iostream>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/rendezvous.h"
#include "common/ring_allreduce.h"
#include "worker/bucket_reducer.h"
#include "worker/local_group.h"
#include "worker/node_allreduce.h"

namespace syncopate {
namespace {

// 64-bit digest of a float buffer's bytes.
uint64_t digest(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const auto* w = reinterpret_cast<const uint32_t*>(c.data_ptr());
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int64_t i = 0; i < c.numel(); ++i) h = (h ^ w[i]) * 0x100000001b3ULL;
  return h;
}

at::TensorOptions on_device(int device) {
  return at::TensorOptions().dtype(at::kFloat).device(device < 0 ? at::Device(at::kCPU) : at::Device(at::kCUDA, device));
}

// All-gathers 24-bit pieces of every replica's digest (exact in float32) with one sum over
// `world` replicas, and names the replicas whose weights differ from replica 0's.
template <class Sum>
void check_digests(const at::Tensor& params, int64_t step, int rank, int world, int local_size, int device, Sum&& sum) {
  const uint64_t d = digest(params);
  at::Tensor slots = at::zeros({2 * static_cast<int64_t>(world)}, on_device(device));
  slots[2 * rank] = static_cast<float>(d & 0xffffff);
  slots[2 * rank + 1] = static_cast<float>((d >> 24) & 0xffffff);
  sum(slots);
  at::Tensor s = slots.to(at::kCPU);
  const float* v = s.data_ptr<float>();
  std::string bad;
  for (int r = 1; r < world; ++r)
    if (v[2 * r] != v[0] || v[2 * r + 1] != v[1])
      bad += fmt::format("{}{} (node {}, local {})", bad.empty() ? "" : ", ", r, r / local_size, r % local_size);
  SYN_CHECK(bad.empty(), fmt::format("step {}: the weights of replica(s) {} differ from replica 0's", step, bad),
            "replicas diverged (non-deterministic kernels or a bug); resume every node from the same checkpoint");
}

// Replicas that never talk to other nodes directly: one replica alone, or the nodes of `ps` mode
// (they meet only through the parameter servers). The node's local replicas, if several, still
// average their gradients and share their weights through the local group.
class IndependentReplicas : public Replicas {
 public:
  IndependentReplicas(int node, int nnodes, int local, std::shared_ptr<LocalGroup> group, int device, int64_t resume)
      : node_(node), nnodes_(nnodes), local_(local), group_(std::move(group)), device_(device) {
    resume_step_ = resume;
  }
  ~IndependentReplicas() override {
    if (regions_ && regions_->reduced() > 0 && local_ == 0)  // each region is pushed the moment it is reduced
      std::cerr << fmt::format("[ps] {} of {} shard pushes left during backward\n", regions_->launched_early(),
                               regions_->reduced());
  }
  void reduce_during_backward(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                              at::Tensor flat_grads, std::vector<int64_t> bounds,
                              std::function<void(int)> on_region_mean) override {
    regions_ = std::make_unique<BucketReducer>(
        params, ranges, flat_grads, std::move(bounds), device_,
        [this, done = std::move(on_region_mean)](int r, at::Tensor region) {
          if (group_) {  // the node's mean, on local replica 0
            group_->reduce_sum(local_, region, 0);
            if (local_ == 0) region.div_(local_size());
          }
          if (local_ == 0 && done) done(r);
        });
  }
  void arm_overlap() override {
    if (regions_) regions_->arm();
  }
  int rank() const override { return node_ * local_size() + local_; }
  int world() const override { return nnodes_ * local_size(); }
  int local_rank() const override { return local_; }
  int local_size() const override { return group_ ? group_->size() : 1; }
  int replicas_per_step() const override { return local_size(); }
  void abort(const std::string& why) override {
    if (group_) group_->abort(why);
  }
  // With regions reduced during backward only local replica 0 holds the mean (the others take
  // its weights after the update); otherwise every replica gets it.
  void average_gradients(at::Tensor& grads) override {
    if (regions_ && regions_->finish()) return;
    if (!group_) return;
    group_->all_reduce_sum(local_, grads);
    grads.div_(local_size());
  }
  double average(double x) override {
    if (!group_) return x;
    at::Tensor t = at::full({1}, x, on_device(device_));
    group_->all_reduce_sum(local_, t);
    return t.item<double>() / local_size();
  }
  void broadcast_from_rank0(at::Tensor& params) override {
    if (group_) group_->broadcast(local_, params, 0);
  }
  void check_identical(const at::Tensor& params, int64_t step) override {
    if (!group_) return;
    check_digests(params, step, local_, local_size(), local_size(), device_,
                  [&](at::Tensor& t) { group_->all_reduce_sum(local_, t); });
  }

 private:
  int node_, nnodes_, local_;
  std::shared_ptr<LocalGroup> group_;
  int device_;
  std::unique_ptr<BucketReducer> regions_;  // ps: shard regions reduced (and pushed) during backward
};

// Every replica of the job takes every step together: gradients are summed over the local group
// and the ring of nodes (NodeAllreduce; a job of one node has no ring), bucket by bucket while
// backward runs (dist.overlap) or as one buffer after it.
class RingReplicas : public Replicas {
 public:
  RingReplicas(std::shared_ptr<Ring> ring, std::shared_ptr<LocalGroup> group, int local, int device, const DistConfig& c)
      : ring_(std::move(ring)), group_(std::move(group)), local_(local), local_size_(group_ ? group_->size() : 1),
        device_(device), cfg_(c),
        allreducer_(ring_->world > 1 && rings(parse_hierarchy(c.hierarchy), local)
                        ? std::make_unique<RingAllreducer>(ring_->rank, ring_->world, ring_->next_of(local), ring_->prev_of(local))
                        : nullptr),
        node_(group_.get(), local, allreducer_.get(), ring_->world, parse_hierarchy(c.hierarchy)) {
    resume_step_ = ring_->resume_step;
    opt_.bf16_wire = c.bf16_wire;
    opt_.segment_bytes = static_cast<size_t>(c.segment_kb) << 10;
  }
  ~RingReplicas() override {
    if (buckets_ && buckets_->reduced() > 0 && rank() == 0)
      std::cout << fmt::format("[dist] {} of {} bucket reductions started during backward\n", buckets_->launched_early(),
                               buckets_->reduced());
  }

  // DDP's buckets (dist.first_bucket_kb, then dist.bucket_kb), each summed over every replica by
  // NodeAllreduce as soon as backward has finished it.
  void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
              at::Tensor flat_grads) override {
    if (!cfg_.overlap) return;
    buckets_ = std::make_unique<BucketReducer>(
        params, ranges, flat_grads, bucket_bounds(ranges, cfg_.first_bucket_kb * 1024 / 4, cfg_.bucket_kb * 1024 / 4),
        device_, [this](int, at::Tensor bucket) { node_.sum(bucket, opt_); });
    if (rank() == 0)
      std::cout << fmt::format("[dist] {} gradient buckets, all-reduced during backward\n", buckets_->regions());
  }

  void arm_overlap() override {
    if (buckets_) buckets_->arm();
  }
  int rank() const override { return ring_->rank * local_size_ + local_; }
  int world() const override { return ring_->world * local_size_; }
  int local_rank() const override { return local_; }
  int local_size() const override { return local_size_; }
  int replicas_per_step() const override { return world(); }
  // Also ends the node's ring links: replicas blocked on a lane fail at once instead of after
  // dist.timeout_s, and the other nodes see this node leave.
  void abort(const std::string& why) override {
    if (group_) group_->abort(why);
    ring_->shutdown();
  }

  void average_gradients(at::Tensor& grads) override {
    if (!buckets_ || !buckets_->finish()) node_.sum(grads, opt_);  // not reduced during backward: all at once
    grads.div_(world());
  }
  double average(double x) override {
    at::Tensor t = at::full({1}, x, on_device(device_));
    node_.sum(t, exact());
    return t.item<double>() / world();
  }
  void broadcast_from_rank0(at::Tensor& params) override {
    if (rank() != 0) params.zero_();
    node_.sum(params, exact());  // x + 0 + ... + 0 == x exactly
  }
  void check_identical(const at::Tensor& params, int64_t step) override {
    check_digests(params, step, rank(), world(), local_size_, device_, [&](at::Tensor& t) { node_.sum(t, exact()); });
  }

 private:
  RingAllreduceOptions exact() const { return RingAllreduceOptions{opt_.segment_bytes, /*bf16_wire=*/false}; }
  std::shared_ptr<Ring> ring_;  // shared by the node's local replicas; replica l rings over lane l
  std::shared_ptr<LocalGroup> group_;  // null: one local replica
  int local_, local_size_, device_;
  DistConfig cfg_;
  std::unique_ptr<RingAllreducer> allreducer_;  // one sender thread and buffer set for every collective
  NodeAllreduce node_;
  RingAllreduceOptions opt_;
  std::unique_ptr<BucketReducer> buckets_;  // dist.overlap: reductions during backward (made in attach())
};

}  // namespace

std::vector<std::shared_ptr<Replicas>> make_replicas(const DistConfig& c, const std::string& token,
                                                     const std::string& fingerprint,
                                                     const std::vector<int64_t>& checkpoints,
                                                     std::shared_ptr<LocalGroup> group, const std::vector<int>& devices) {
  const int L = group ? group->size() : 1;
  auto device = [&](int l) { return devices.empty() ? -1 : devices[static_cast<size_t>(l)]; };
  std::vector<std::shared_ptr<Replicas>> out;
  const int64_t newest = checkpoints.empty() ? -1 : *std::max_element(checkpoints.begin(), checkpoints.end());
  const bool ps = c.mode == "ps", ring_of_nodes = c.mode == "ring" && c.nnodes > 1;
  if (ring_of_nodes || (!ps && L > 1)) {  // synchronous replicas: buckets reduced during backward
    std::shared_ptr<Ring> ring;
    if (ring_of_nodes) {
      RendezvousOptions o = rendezvous_options(c, token, fingerprint);
      o.checkpoints = checkpoints;
      o.lanes = ring_lanes(parse_hierarchy(c.hierarchy), L);
      ring = std::make_shared<Ring>(connect_ring(o));
    } else {  // one node of several replicas: no ring, the local group alone
      ring = std::make_shared<Ring>();
      ring->resume_step = newest;
    }
    for (int l = 0; l < L; ++l) out.push_back(std::make_unique<RingReplicas>(ring, group, l, device(l), c));
  } else {  // no peers to agree with: the newest local checkpoint
    const int64_t resume = newest;
    for (int l = 0; l < L; ++l)
      out.push_back(std::make_unique<IndependentReplicas>(ps ? static_cast<int>(c.node_rank) : 0,
                                                          ps ? static_cast<int>(c.nnodes) : 1, l, group, device(l), resume));
  }
  return out;
}

}  // namespace syncopate
