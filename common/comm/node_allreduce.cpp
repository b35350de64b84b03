#include "common/comm/node_allreduce.h"

#include <ATen/ATen.h>

#include "common/check.h"
#include "common/comm/local_group.h"
#include "common/trace.h"

namespace syncopate {
// The inter-node ring on host memory: GPU slices travel through the staging buffer (pinned,
// reused by every later call: one per bucket per step).
void NodeAllreduce::ring_sum(RingAllreducer& lane, at::Tensor t, const RingAllreduceOptions& opt) const {
  at::Tensor host = staging_.to_host(t);  // waits for the work queued on the current stream
  TraceSpan span("ring all-reduce (nodes)", "comm");
  lane.sum(host.data_ptr<float>(), static_cast<size_t>(host.numel()), opt);
  HostStaging::to_device(t, host);
}

void NodeAllreduce::sum(at::Tensor t, const RingAllreduceOptions& opt) const {
  SYN_CHECK(t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous(),
            "all-reduce needs a contiguous 1-D float32 buffer", "this is a bug");
  if (!group_ || group_->size() == 1) {
    if (nodes_ > 1) ring_sum(*lane_, t, opt);
    return;
  }
  if (nodes_ == 1) {  // one node: the local group is everything
    TraceSpan span("all-reduce (in node)", "comm");
    group_->all_reduce_sum(local_rank_, t);
    return;
  }
  if (hierarchy_ == Hierarchy::kRoot) {
    group_->reduce_sum(local_rank_, t, 0);
    if (local_rank_ == 0) ring_sum(*lane_, t, opt);
    group_->broadcast(local_rank_, t, 0);
    return;
  }
  {
    TraceSpan span("reduce-scatter (in node)", "comm");
    group_->reduce_scatter_sum(local_rank_, t);
  }
  const int64_t n = t.numel(), L = group_->size();
  ring_sum(*lane_, t.slice(0, Sharding::begin(n, L, local_rank_), Sharding::begin(n, L, local_rank_ + 1)), opt);
  TraceSpan span("all-gather (in node)", "comm");
  group_->all_gather(local_rank_, t);
}

Hierarchy parse_hierarchy(const std::string& name) {
  if (name == "sliced") return Hierarchy::kSliced;
  if (name == "root") return Hierarchy::kRoot;
  SYN_FAIL("dist.hierarchy='" + name + "' is not a hierarchy", "use sliced or root");
}

}  // namespace syncopate
