// ElasticRingSync (dist.elastic with dist.mode=ring; issue 30): a RingSync whose ring is the
// current epoch of a membership kept by the rendezvous service (ElasticRing, elastic_ring.h; the
// rules in common/comm/ring_membership.h). Nobody restarts when the membership changes:
//   - a node lost mid-step: the collective fails on its neighbours, each shuts its own links so the
//     failure reaches every member within milliseconds, and finish_step reports the step abandoned
//     (nothing applied);
//   - at every step boundary the members sum one flag over the ring: set where the service told a
//     node that another waits to join, or by a node that leaves (SIGTERM) — all see the same sum;
//   - then, or after a loss, every member asks the service for the next epoch, links the new ring,
//     and takes the state of the epoch's root (the member furthest along): weights, AdamW moments
//     and step, the job's step, tokens and data position, summed over the ring into scratch
//     buffers (the root's values plus zeros: exact) and copied in only once all arrived, so a
//     re-formation that breaks off leaves every node's own state as it was.
// A lost node's share of the global batch is dropped: the ring goes on with its members' batches
// (the data order's position advances by what they take, so no sample is used twice or skipped),
// and the learning rate per step is unchanged. One replica per node (validated).
#include <ATen/ATen.h>

#include "common/check.h"
#include "common/comm/rendezvous_session.h"
#include "model/flat_parameters.h"
#include "worker/sync/elastic_ring.h"
#include "worker/sync/ring_sync.h"

namespace syncopate {
namespace {

class ElasticRingSync : public GradientSync {
 public:
  ElasticRingSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(0, 1), device_(s.device) {
    SyncSetup alone = s;
    alone.ring = nullptr;  // no ring until the first epoch
    ring_sync_ = std::make_unique<RingSync>(alone, flat, params);
    ring_ = std::make_unique<ElasticRing>(s.session, s.dist, s.ring_latency_s,
                                          [this](std::shared_ptr<Ring> r) { ring_sync_->relink(std::move(r)); });
  }
  ~ElasticRingSync() override {
    ring_sync_.reset();  // its collectives hold the links
    ring_.reset();
  }

  int rank() const override { return ring_sync_->rank(); }
  int world() const override { return ring_sync_->world(); }
  int replicas_per_step() const override { return ring_sync_->replicas_per_step(); }
  void start(at::Tensor&, int64_t) override {}  // the ring forms in the first regroup()
  // Resumed from another synchronization's checkpoint: the first formation starts every member from
  // the job's mean weights and moments (take_state), as RingSync::start does on a fixed ring.
  void restart_state(const at::Tensor& p) override {
    ring_sync_->restart_state(p);
    switched_ = true;
  }
  void begin_last_backward(double lr, int64_t step) override {
    if (!ring_->broken()) ring_sync_->begin_last_backward(lr, step);
  }
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    StepSync abandoned;
    abandoned.abandoned = true;
    if (ring_->broken()) return abandoned;
    try {
      return ring_sync_->finish_step(params, grads, lr, step);
    } catch (const Error& e) {
      ring_->lost(step, e.what());
      return abandoned;
    }
  }
  double average(double x, bool* any) override { return ring_sync_->average(x, any); }
  void check_identical(const at::Tensor& params, int64_t step) override {
    // (a failed sum: the next step is abandoned at once and the ring re-forms after it)
    if (!ring_->broken() && !ring_->left())
      elastic_check_identical(params, step, rank(), world(), device_, sum_exact(), ring_->lost_at(step));
  }
  FlatAdamW* optimizer() override { return ring_sync_->optimizer(); }
  SyncCounters counters() const override { return ring_sync_->counters(); }
  void set_release_gate(std::function<void(double)> gate) override { ring_sync_->set_release_gate(std::move(gate)); }
  void finish(int64_t) override { ring_->done(); }

  std::optional<JobPosition> regroup(at::Tensor& params, const JobPosition& at) override {
    if (ring_->left()) return std::nullopt;
    bool change = !ring_->formed() || ring_->broken();
    if (!change) change = agree(ring_->pending() ? 1.f : 0.f, at.step);
    if (!change) return std::nullopt;
    return ring_->reform(at.step, at.step, [&](const Epoch& e) { return take_state(params, at, e); });
  }

  void leave(int64_t step) override {
    if (ring_->formed() && !ring_->broken()) agree(1.f, step);  // the members hear it at this boundary's agreement
    ring_->leave();
  }

 private:
  // This boundary's agreement: the sum of every member's flag; a failure counts as a change.
  bool agree(float flag, int64_t step) { return elastic_agree(flag, device_, sum_exact(), ring_->lost_at(step)); }
  std::function<void(at::Tensor&)> sum_exact() {
    return [this](at::Tensor& t) { ring_sync_->sum_exact(t); };
  }

  // Every member ends with the root's state; nothing here changes until every sum arrived. After a
  // switch (the root's restart_state) the state is instead the mean weights and moments of the
  // members at the root's step (the nodes' checkpoints may differ; a node that starts fresh, or from
  // an older checkpoint, holds none of the job's), with the root's step count.
  JobPosition take_state(at::Tensor& params, const JobPosition& at, const Epoch& e) {
    const bool root = e.index == e.root_index();
    FlatAdamW& opt = *ring_sync_->optimizer();
    std::vector<int64_t> v = {at.step, at.tokens, at.data_position, opt.steps(), switched_ ? 1 : 0};
    ring_sync_->share_ints(v, root);
    const bool mean = v[4] != 0, counts = mean ? at.step == v[0] : root;
    float n = 1;
    if (mean) n = count_members(counts, device_, sum_exact());
    std::vector<at::Tensor*> live = {&params, &opt.exp_avg(), &opt.exp_avg_sq()};
    std::vector<at::Tensor> got;
    for (at::Tensor* t : live) {
      at::Tensor x = counts ? t->clone() : at::zeros_like(*t);
      ring_sync_->sum_exact(x);
      if (mean) x.div_(n);
      got.push_back(x);
    }
    for (size_t k = 0; k < live.size(); ++k) live[k]->copy_(got[k]);
    opt.set_steps(v[3]);
    switched_ = false;
    return {v[0], v[1], v[2]};
  }

  int device_;
  std::unique_ptr<RingSync> ring_sync_;
  std::unique_ptr<ElasticRing> ring_;
  bool switched_ = false;  // resumed from another synchronization's checkpoint (restart_state)
};

}  // namespace

std::unique_ptr<GradientSync> make_elastic_ring_sync(const SyncSetup& s, FlatParameters& flat,
                                                     const std::vector<at::Tensor>& params) {
  return std::make_unique<ElasticRingSync>(s, flat, params);
}

}  // namespace syncopate
