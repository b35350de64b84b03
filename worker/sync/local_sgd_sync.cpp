// LocalSgdSync: local SGD / DiLoCo over the ring (dist.sync_every = H > 1). Inside a node the
// local replicas average every step and take the same inner AdamW step (a RingSync of the node
// alone, inner state local and checkpointed); the nodes meet once every H steps: each node's
// pseudo-gradient Delta = theta_start - theta_now is summed over the job (NodeAllreduce: the node's
// local group and the ring of nodes), divided by the world, and every replica applies the same
// outer step (OuterOptimizer: average, or DiLoCo's Nesterov) from the round's start theta_start.
// Between synchronizations nothing crosses nodes (the logged loss is the node's own).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/comm/local_group.h"
#include "common/comm/node_allreduce.h"
#include "common/comm/rendezvous.h"
#include "common/comm/ring_allreduce.h"
#include "common/outer_optimizer.h"
#include "model/flat_parameters.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace {

class LocalSgdSync : public GradientSync {
 public:
  LocalSgdSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(s.local, s.local_size), every_(s.dist.sync_every), ring_(s.ring), group_(s.group), device_(s.device),
        nodes_(ring_ ? ring_->world : 1), node_(ring_ ? ring_->rank : 0),
        allreducer_(nodes_ > 1 && rings(parse_hierarchy(s.dist.hierarchy), s.local)
                        ? std::make_unique<RingAllreducer>(ring_->rank, ring_->world, ring_->next_of(s.local),
                                                           ring_->prev_of(s.local))
                        : nullptr),
        sum_(s.group.get(), s.local, allreducer_.get(), nodes_, parse_hierarchy(s.dist.hierarchy)),
        inner_(make_ring_sync(node_only(s), flat, params)),
        outer_(parse_outer_rule(s.dist.outer), s.dist.outer_lr, s.dist.outer_momentum, flat.numel(), flat.params.options()),
        start_(flat.params.clone()), delta_(at::empty_like(flat.params)) {
    wire_.wire = parse_wire_format(s.dist.wire);
    wire_.segment_bytes = static_cast<size_t>(s.dist.segment_kb) << 10;
  }

  int rank() const override { return node_ * local_size_ + local_; }
  int world() const override { return nodes_ * local_size_; }
  int replicas_per_step() const override { return local_size_; }  // each node steps on its own

  // At a round boundary every replica takes rank 0's weights (x + 0 + ... + 0 == x) and the round
  // starts there. In the middle of a round (a resume) each node keeps its own weights, and the
  // round's start and outer momentum came from the checkpoint (state()).
  // After a switch from another synchronization (restart_state), mid-round or not, the nodes' loaded
  // weights may differ: every replica takes the job's mean, and the round starts there.
  void start(at::Tensor& params, int64_t step) override {
    if (switched_) {
      sum_.sum(params, exact());
      params.div_(world());
      start_.copy_(params);
      return;
    }
    if (step % every_ != 0) return;
    if (rank() != 0) params.zero_();
    sum_.sum(params, exact());
    start_.copy_(params);
  }
  void begin_last_backward(double lr, int64_t step) override { inner_->begin_last_backward(lr, step); }
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    StepSync r = inner_->finish_step(params, grads, lr, step);  // the node's inner step
    r.round = (step + 1) / every_;
    if ((step + 1) % every_ != 0) return r;
    const int64_t mark = wire_bytes(), mark_in = wire_bytes_received();
    at::sub_out(delta_, start_, params);  // this node's pseudo-gradient
    sum_.sum(delta_, wire_);
    delta_.div_(world());
    r.outer_norm = outer_.step(start_, delta_, params);
    r.wire_bytes = wire_bytes() - mark;
    r.wire_bytes_received = wire_bytes_received() - mark_in;
    return r;
  }
  void synchronize(at::Tensor& params) override { inner_->synchronize(params); }
  double average(double x, bool* any) override { return inner_->average(x, any); }  // the node's: no per-step cross-node collective
  // Replicas agree job-wide at round boundaries, within the node always.
  void check_identical(const at::Tensor& params, int64_t step) override {
    if (step % every_ != 0) return inner_->check_identical(params, step);
    check_replicas_identical(params, step, rank(), world(), local_size_, device_, [&](at::Tensor& t) { sum_.sum(t, exact()); });
  }
  // (Called at round boundaries: dist.readvise_every is a multiple of sync_every.)
  std::function<void(at::Tensor&)> job_sum() override {
    return [this](at::Tensor& t) {
      sum_.sum(t, exact());
      if (group_) group_->wait_device(local_, "the job's sum");  // bounded, before the host reads it
    };
  }
  FlatAdamW* optimizer() override { return inner_->optimizer(); }
  int64_t job_tokens(int64_t node_tokens, int64_t) const override { return node_tokens * nodes_; }  // they step together
  // Mid-round a node holds its inner weights; the job's weights are the round's start.
  ShippedWeights shipped(const at::Tensor&) override { return {start_, "outer"}; }
  std::vector<std::pair<std::string, at::Tensor>> state() override { return local_sgd_state(start_, outer_.momentum()); }
  void restart_state(const at::Tensor& params) override {
    start_.copy_(params);
    outer_.momentum().zero_();
    switched_ = true;
  }
  SyncCounters counters() const override {
    SyncCounters c = inner_->counters();
    c.wire_bytes = wire_bytes();
    c.wire_bytes_received = wire_bytes_received();
    return c;
  }

 private:
  RingAllreduceOptions exact() const { return RingAllreduceOptions{wire_.segment_bytes, WireFormat::kF32}; }
  int64_t wire_bytes() const { return allreducer_ ? allreducer_->bytes_sent() : 0; }
  int64_t wire_bytes_received() const { return allreducer_ ? allreducer_->bytes_received() : 0; }

  int64_t every_;
  std::shared_ptr<Ring> ring_;
  std::shared_ptr<LocalGroup> group_;  // null: one local replica
  int device_, nodes_, node_;
  std::unique_ptr<RingAllreducer> allreducer_;
  NodeAllreduce sum_;
  std::unique_ptr<GradientSync> inner_;
  OuterOptimizer outer_;
  at::Tensor start_, delta_;  // the round's starting weights; the pseudo-gradient (reused)
  RingAllreduceOptions wire_;
  bool switched_ = false;  // resumed from another synchronization's checkpoint (restart_state)
};

}  // namespace

std::unique_ptr<GradientSync> make_local_sgd_sync(const SyncSetup& s, FlatParameters& flat,
                                                  const std::vector<at::Tensor>& params) {
  return std::make_unique<LocalSgdSync>(s, flat, params);
}

}  // namespace syncopate
