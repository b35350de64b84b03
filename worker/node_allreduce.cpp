#include "worker/node_allreduce.h"

#include <ATen/ATen.h>

#include "common/check.h"
#include "worker/local_group.h"

namespace syncopate {
// The inter-node ring on host memory: GPU slices travel through one pinned host buffer, grown to
// the largest slice and reused by every later call (one per bucket per step).
void NodeAllreduce::ring_sum(RingAllreducer& lane, at::Tensor t, const RingAllreduceOptions& opt) const {
  if (t.is_cpu()) {
    lane.sum(t.data_ptr<float>(), static_cast<size_t>(t.numel()), opt);
    return;
  }
  if (!host_.defined() || host_.numel() < t.numel())
    host_ = at::empty({t.numel()}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  at::Tensor host = host_.slice(0, 0, t.numel());
  host.copy_(t);  // waits for the work queued on the current stream
  lane.sum(host.data_ptr<float>(), static_cast<size_t>(host.numel()), opt);
  t.copy_(host);
}

void NodeAllreduce::sum(at::Tensor t, const RingAllreduceOptions& opt) const {
  SYN_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous(),
            "all-reduce needs a contiguous 1-D float32 buffer", "this is a bug");
  if (!group_ || group_->size() == 1) {
    if (nodes_ > 1) ring_sum(*lane_, t, opt);
    return;
  }
  if (nodes_ == 1) {  // one node: the local group is everything
    group_->all_reduce_sum(local_rank_, t);
    return;
  }
  if (hierarchy_ == Hierarchy::kRoot) {
    group_->reduce_sum(local_rank_, t, 0);
    if (local_rank_ == 0) ring_sum(*lane_, t, opt);
    group_->broadcast(local_rank_, t, 0);
    return;
  }
  group_->reduce_scatter_sum(local_rank_, t);
  const int64_t n = t.numel(), L = group_->size();
  ring_sum(*lane_, t.slice(0, slice_begin(n, L, local_rank_), slice_begin(n, L, local_rank_ + 1)), opt);
  group_->all_gather(local_rank_, t);
}

Hierarchy parse_hierarchy(const std::string& name) {
  if (name == "sliced") return Hierarchy::kSliced;
  if (name == "root") return Hierarchy::kRoot;
  SYN_FAIL("dist.hierarchy='" + name + "' is not a hierarchy", "use sliced or root");
}

}  // namespace syncopate
