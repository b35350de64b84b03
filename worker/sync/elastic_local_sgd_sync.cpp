// ElasticLocalSgdSync (dist.elastic, dist.mode=ring, dist.sync_every = H > 1; issue 30): local SGD
// / DiLoCo whose nodes come and go at round boundaries, on an elastic ring (ElasticRing,
// elastic_ring.h) instead of a fixed one. One replica per node (validated). As LocalSgdSync, each
// node takes its inner steps alone (clip and AdamW, nothing crosses nodes) and at the end of every
// round the nodes sum their pseudo-gradients Delta = theta_start - theta_now, and every node applies
// the same outer step (OuterOptimizer) from the round's start. Membership:
//   - joins and leaves take effect at round boundaries only: at each one the members sum a flag
//     (a node waits to join, or one leaves with SIGTERM), and if it is set the ring re-forms there;
//     a joiner takes the round's start, the outer momentum, the weights and the inner AdamW state
//     of the epoch's root, and the job's step, tokens and data position;
//   - a node lost during a round is found at the round's sum (nothing crosses nodes before): the
//     sum fails, finish_step reports the step abandoned, and the survivors re-form and apply the
//     round with their own deltas intact (recomputed from the round's start and their weights,
//     which the failed sum did not touch), averaged over the nodes that completed the round — the
//     lost node's round is dropped, as a lost node's batch is on the elastic ring. If some member
//     had already received the complete sum (the failure came at the very end), every member takes
//     that member's applied round instead (the root: the service picks the member furthest along,
//     and a node that holds an unapplied round counts half a step further than one that does not);
//   - a node preempted (SIGTERM) at a round boundary leaves through that boundary's agreement; one
//     preempted in the middle of a round leaves at once, and the others find it gone at the
//     round's sum (its partial round is dropped, as a lost node's).
// The job's token count is every member's (replicas_per_step() is the members' count), as on the
// elastic ring. The service waits max(dist.reform_wait_s, dist.timeout_s) for the members at a
// re-formation (trainer.cpp), since they reach a round's end up to a round's drift apart.
// Known gap (review helper-26): a member whose re-formation breaks off after the others received its
// last sum asks again at once while they train on; if the round outlasts that wait, the service
// forms an epoch of it alone (with dist.min_nodes 1), and at the next boundary its solo round, one
// step further by the key, becomes the job's. Set dist.min_nodes above 1 to exclude it; the cure is a
// service rule (such a request waits for every live member, as a joiner's does), not built.
#include <ATen/ATen.h>

#include "common/check.h"
#include "common/log.h"
#include "common/comm/node_allreduce.h"
#include "common/comm/rendezvous.h"
#include "common/comm/rendezvous_session.h"
#include "common/comm/ring_allreduce.h"
#include "common/outer_optimizer.h"
#include "model/flat_parameters.h"
#include "worker/sync/elastic_ring.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace {

class ElasticLocalSgdSync : public GradientSync {
 public:
  ElasticLocalSgdSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(0, 1), every_(s.dist.sync_every), device_(s.device), hierarchy_(parse_hierarchy(s.dist.hierarchy)),
        node_samples_(s.samples_per_step), sample_tokens_(s.tokens_per_sample),
        inner_(make_ring_sync(node_only(s), flat, params)),
        outer_(parse_outer_rule(s.dist.outer), s.dist.outer_lr, s.dist.outer_momentum, flat.numel(), flat.params.options()),
        start_(flat.params.clone()), delta_(at::empty_like(flat.params)) {
    SYN_CHECK(node_samples_ > 0 && sample_tokens_ > 0, "elastic local SGD without the samples and tokens of a node's step",
              "this is a bug (SyncSetup::samples_per_step, tokens_per_sample)");
    wire_.wire = parse_wire_format(s.dist.wire);
    wire_.segment_bytes = static_cast<size_t>(s.dist.segment_kb) << 10;
    relink(nullptr);
    ring_ = std::make_unique<ElasticRing>(s.session, s.dist, s.ring_latency_s,
                                          [this](std::shared_ptr<Ring> r) { relink(std::move(r)); });
  }
  ~ElasticLocalSgdSync() override {
    sum_.reset();  // the collectives hold the links
    allreducer_.reset();
    ring_.reset();
  }

  int rank() const override { return node_; }
  int world() const override { return nodes_; }
  int replicas_per_step() const override { return nodes_; }  // the job's tokens per step: every member's batch
  void start(at::Tensor&, int64_t) override {}               // the ring forms in the first regroup()
  void begin_last_backward(double lr, int64_t step) override { inner_->begin_last_backward(lr, step); }

  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    StepSync r = inner_->finish_step(params, grads, lr, step);  // this node's own inner step
    r.round = (step + 1) / every_;
    if ((step + 1) % every_ != 0) return r;
    pending_ = true;  // the round's outer step is not applied until the sum below completes
    round_world_ = nodes_;
    if (!ring_->broken()) {
      try {
        const int64_t mark = wire_bytes(), mark_in = wire_bytes_received();
        at::sub_out(delta_, start_, params);  // this node's pseudo-gradient
        sum_->sum(delta_, wire_);
        delta_.div_(nodes_);
        r.outer_norm = outer_.step(start_, delta_, params);
        pending_ = false;
        r.wire_bytes = wire_bytes() - mark;
        r.wire_bytes_received = wire_bytes_received() - mark_in;
        return r;
      } catch (const Error& e) {
        ring_->lost(step, e.what());
      }
    }
    r.abandoned = true;  // regroup() applies the round on the re-formed ring (or takes it from a member that did)
    return r;
  }

  std::optional<JobPosition> regroup(at::Tensor& params, const JobPosition& at) override {
    if (ring_->left()) return std::nullopt;
    const bool boundary = at.step % every_ == 0;
    // A ring broken mid-round (a check's sum failed) re-forms at the round's end, where every member comes.
    bool change = !ring_->formed() || (ring_->broken() && (boundary || pending_));
    if (!change && boundary && !ring_->broken()) change = agree(ring_->pending() ? 1.f : 0.f, at.step);
    if (!change) return std::nullopt;
    // The service's root is the member with the largest key: a node holding the round unapplied
    // (pending) stands half a step past one at the same step without it (a node restarted there).
    const int64_t key = 2 * at.step + (pending_ ? 1 : 0);
    return ring_->reform(key, at.step, [&](const Epoch& e) { return settle(params, at, e); });
  }

  void leave(int64_t step) override {
    // At a round boundary the members hear it in this boundary's agreement; mid-round nobody listens.
    if (ring_->formed() && !ring_->broken() && step % every_ == 0) agree(1.f, step);
    ring_->leave();
  }

  double average(double x, bool* any) override { return inner_->average(x, any); }  // the node's own loss
  // The members hold the same weights at round boundaries (in between each its own).
  void check_identical(const at::Tensor& params, int64_t step) override {
    // (a failed sum: the ring re-forms at the round's end)
    if (step % every_ == 0 && !ring_->broken() && !ring_->left())
      elastic_check_identical(params, step, rank(), world(), device_, sum_exact(), ring_->lost_at(step));
  }
  FlatAdamW* optimizer() override { return inner_->optimizer(); }
  // Mid-round a node holds its inner weights; the job's weights are the round's start.
  ShippedWeights shipped(const at::Tensor&) override { return {start_, "outer"}; }
  std::vector<std::pair<std::string, at::Tensor>> state() override { return local_sgd_state(start_, outer_.momentum()); }
  // Resumed from another synchronization's checkpoint: the first formation starts every member
  // from the job's mean weights (settle()).
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
  void finish(int64_t) override { ring_->done(); }

 private:
  RingAllreduceOptions exact() const { return RingAllreduceOptions{wire_.segment_bytes, WireFormat::kF32}; }
  int64_t wire_bytes() const { return bytes_before_ + (allreducer_ ? allreducer_->bytes_sent() : 0); }
  int64_t wire_bytes_received() const { return bytes_in_before_ + (allreducer_ ? allreducer_->bytes_received() : 0); }

  // The collectives move onto `ring` (null: this node alone).
  void relink(std::shared_ptr<Ring> ring) {
    sum_.reset();
    if (allreducer_) bytes_before_ += allreducer_->bytes_sent(), bytes_in_before_ += allreducer_->bytes_received();
    allreducer_.reset();
    nodes_ = ring ? ring->world : 1;
    node_ = ring ? ring->rank : 0;
    if (nodes_ > 1) allreducer_ = std::make_unique<RingAllreducer>(ring->rank, ring->world, ring->next_of(0), ring->prev_of(0));
    sum_ = std::make_unique<NodeAllreduce>(nullptr, 0, allreducer_.get(), nodes_, hierarchy_);
  }

  // A boundary's agreement: the sum of every member's flag; a failure counts as a change.
  bool agree(float flag, int64_t step) { return elastic_agree(flag, device_, sum_exact(), ring_->lost_at(step)); }
  std::function<void(at::Tensor&)> sum_exact() {
    return [this](at::Tensor& t) { sum_->sum(t, exact()); };
  }

  // x <- the root's x, exactly (the root's values plus zeros), into a scratch copy.
  at::Tensor from_root(const at::Tensor& x, bool root) {
    at::Tensor t = root ? x.clone() : at::zeros_like(x);
    sum_->sum(t, exact());
    return t;
  }

  // Run by every member of a new epoch. Nothing of this node's state changes until every sum
  // arrived, so a re-formation that breaks off leaves it as it was (and this node still pending).
  // Which collectives follow is decided by the root's values alone (shared first), so every member
  // issues the same ones.
  JobPosition settle(at::Tensor& params, const JobPosition& at, const Epoch& e) {
    const bool root = e.index == e.root_index();
    FlatAdamW& inner = *inner_->optimizer();
    // Where this node goes on from if it is the root: past the round it holds unapplied (its
    // members' batches of that step taken), or where it stands.
    const int64_t took = pending_ ? round_world_ * node_samples_ : 0;
    std::vector<int64_t> v = {at.step + (pending_ ? 1 : 0), at.tokens + took * sample_tokens_, at.data_position + took,
                              inner.steps(), pending_ ? 1 : 0, switched_ ? 1 : 0};
    share_ints(v, root, params.options(), sum_exact());
    const JobPosition p{v[0], v[1], v[2]};
    const bool root_pending = v[4] != 0, root_switched = v[5] != 0;
    // Whether this node took the very round the root stands at the end of (a survivor of it), or
    // stands where the root does: it keeps its own inner AdamW state (and, mid-round, its inner
    // weights), and only then does a round it holds unapplied count. A member that fell an epoch
    // behind (its last re-formation broke off while the others went on) holds an older round:
    // dropped, and it takes the root's state as a joiner does.
    const bool mine = pending_ && at.step + 1 == p.step;
    const bool same_round = root_pending ? mine : (pending_ ? mine : at.step == p.step);
    // Only what some member lacks crosses the ring (a count of those that need the inner state).
    at::Tensor needy = at::full({1}, same_round ? 0.f : 1.f, replica_options(device_));
    sum_->sum(needy, exact());
    const bool send_moments = needy.cpu().item<float>() > 0;
    at::Tensor start = from_root(start_, root), momentum = from_root(outer_.momentum(), root), m1, m2;
    if (send_moments) m1 = from_root(inner.exp_avg(), root), m2 = from_root(inner.exp_avg_sq(), root);
    at::Tensor weights;
    if (root_switched) {
      // The job resumed another synchronization's checkpoints (restart_state on every node): they
      // may differ, so every member starts from their mean and the round starts there (as
      // LocalSgdSync); the mean of those at the root's step (a node that starts fresh, or from an
      // older checkpoint, holds none of the job's weights).
      const bool counts = !pending_ && at.step == p.step;
      weights = counts ? params.clone() : at::zeros_like(params);
      sum_->sum(weights, exact());
      weights.div_(count_members(counts, device_, sum_exact()));
      start.copy_(weights);
      momentum.zero_();
    } else if (root_pending) {
      // Nobody applied the round: the members that completed it sum their deltas (the others add
      // zeros) and every member applies their mean from the round's start.
      at::Tensor count = at::full({1}, mine ? 1.f : 0.f, replica_options(device_));
      sum_->sum(count, exact());
      const float n = count.cpu().item<float>();
      SYN_CHECK(n >= 1, "the re-formed ring holds no member's round", "this is a bug");
      if (mine) at::sub_out(delta_, start_, params);
      else delta_.zero_();
      sum_->sum(delta_, wire_);
      delta_.div_(n);
      const double mean_delta = delta_.norm().item<double>();
      weights = start.clone();
      const double norm = outer_momentum_step(start, momentum, weights);
      log::info("[dist] node {}: the round ending at step {} applied by the {} member(s) that completed it "
                "(their mean pseudo-gradient's norm {:.4g}, outer update norm {:.4g})",
                ring_->node(), p.step, static_cast<int>(n), mean_delta, norm);
    } else if (send_moments || p.step % every_ == 0) {
      weights = from_root(params, root);
    }
    // Every sum arrived: the root's state, and the round applied where it was pending.
    start_.copy_(start);
    outer_.momentum().copy_(momentum);
    if (!same_round) {
      inner.exp_avg().copy_(m1);
      inner.exp_avg_sq().copy_(m2);
      inner.set_steps(v[3]);
    }
    if (root_switched || root_pending || !same_round || p.step % every_ == 0) params.copy_(weights);
    pending_ = false;
    switched_ = false;
    return p;
  }

  // The outer step of the mean delta_ from `start` with `momentum`, on scratch copies (settle()
  // copies them in once everything arrived): start and weights become the new round's start.
  double outer_momentum_step(at::Tensor& start, at::Tensor& momentum, at::Tensor& weights) {
    at::Tensor live_momentum = outer_.momentum().clone();
    outer_.momentum().copy_(momentum);
    const double norm = outer_.step(start, delta_, weights);
    momentum.copy_(outer_.momentum());
    outer_.momentum().copy_(live_momentum);
    return norm;
  }

  int64_t every_;
  int device_;
  Hierarchy hierarchy_;
  int64_t node_samples_, sample_tokens_;  // training samples of one node's step; tokens per sample
  std::unique_ptr<GradientSync> inner_;
  OuterOptimizer outer_;
  at::Tensor start_, delta_;  // the round's starting weights; the pseudo-gradient (reused)
  RingAllreduceOptions wire_;
  std::unique_ptr<ElasticRing> ring_;
  std::unique_ptr<RingAllreducer> allreducer_;  // on the current epoch's links
  std::unique_ptr<NodeAllreduce> sum_;          // (holds allreducer_: goes first)
  int nodes_ = 1, node_ = 0;
  int64_t bytes_before_ = 0, bytes_in_before_ = 0;  // wire bytes of the allreducers of earlier epochs
  bool pending_ = false;   // this node completed a round whose outer step is not applied yet
  int64_t round_world_ = 0;  // the members of the ring on which that round's sum failed
  bool switched_ = false;    // resumed from another synchronization's checkpoint (restart_state)
};

}  // namespace

std::unique_ptr<GradientSync> make_elastic_local_sgd_sync(const SyncSetup& s, FlatParameters& flat,
                                                          const std::vector<at::Tensor>& params) {
  return std::make_unique<ElasticLocalSgdSync>(s, flat, params);
}

}  // namespace syncopate
