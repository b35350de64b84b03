// ElasticRingSync (dist.elastic with dist.mode=ring; issue 30): a RingSync whose ring is the
// current epoch of a membership kept by the rendezvous service (common/comm/rendezvous_session.h,
// ring_membership.h). Nobody restarts when the membership changes:
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
#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/rendezvous.h"
#include "common/comm/rendezvous_session.h"
#include "common/log.h"
#include "model/flat_parameters.h"
#include "worker/sync/ring_sync.h"

namespace syncopate {
namespace {

class ElasticRingSync : public GradientSync {
 public:
  ElasticRingSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(0, 1), session_(s.session), dist_(s.dist), device_(s.device), latency_s_(s.ring_latency_s) {
    SYN_CHECK(session_, "the elastic ring has no session with the rendezvous service", "this is a bug");
    SyncSetup alone = s;
    alone.ring = nullptr;  // no ring until the first epoch
    ring_sync_ = std::make_unique<RingSync>(alone, flat, params);
  }
  ~ElasticRingSync() override {
    ring_sync_.reset();  // its collectives hold the links
    ring_.reset();
  }

  int rank() const override { return ring_sync_->rank(); }
  int world() const override { return ring_sync_->world(); }
  int replicas_per_step() const override { return ring_sync_->replicas_per_step(); }
  void start(at::Tensor&, int64_t) override {}  // the ring forms in the first regroup()
  void restart_state(const at::Tensor& p) override { ring_sync_->restart_state(p); }
  void begin_last_backward(double lr, int64_t step) override {
    if (!broken_) ring_sync_->begin_last_backward(lr, step);
  }
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    StepSync abandoned;
    abandoned.abandoned = true;
    if (broken_) return abandoned;
    try {
      return ring_sync_->finish_step(params, grads, lr, step);
    } catch (const Error& e) {
      lost(step, e.what());
      return abandoned;
    }
  }
  double average(double x, bool* any) override { return ring_sync_->average(x, any); }
  void check_identical(const at::Tensor& params, int64_t step) override {
    if (broken_ || left_) return;
    struct LinkLost {};
    try {
      check_replicas_identical(params, step, rank(), world(), 1, device_, [&](at::Tensor& t) {
        try {
          ring_sync_->sum_exact(t);
        } catch (const Error& e) {
          lost(step, e.what());
          throw LinkLost{};
        }
      });
    } catch (const LinkLost&) {
      // the next step is abandoned at once and the ring re-forms after it
    }
  }
  FlatAdamW* optimizer() override { return ring_sync_->optimizer(); }
  SyncCounters counters() const override { return ring_sync_->counters(); }
  void set_release_gate(std::function<void(double)> gate) override { ring_sync_->set_release_gate(std::move(gate)); }
  void finish(int64_t) override { session_->done(); }

  std::optional<JobPosition> regroup(at::Tensor& params, const JobPosition& at) override {
    if (left_) return std::nullopt;
    bool change = !formed_ || broken_;
    if (!change) change = agree(session_->pending() ? 1.f : 0.f, at.step);
    if (!change) return std::nullopt;
    return reform(params, at);
  }

  void leave(int64_t step) override {
    if (formed_ && !broken_) agree(1.f, step);  // the members hear it at this boundary's agreement
    session_->leave();
    left_ = true;
    drop_ring();
  }

 private:
  // This boundary's agreement: the sum of every member's flag; a failure counts as a change.
  bool agree(float flag, int64_t step) {
    at::Tensor f = at::full({1}, flag, replica_options(device_));
    try {
      ring_sync_->sum_exact(f);
      return f.cpu().item<float>() > 0;
    } catch (const Error& e) {
      lost(step, e.what());
      return true;
    }
  }
  void lost(int64_t step, const std::string& why) {
    if (!broken_)
      log::warn("[dist] node {}: the ring broke at step {} ({}); it re-forms through the rendezvous service",
                session_->node(), step + 1, why);
    broken_ = true;
    if (ring_) ring_->shutdown();  // the neighbours fail at once too, and so on around the ring
  }
  void drop_ring() {
    if (ring_) ring_->shutdown();
    ring_sync_->relink(nullptr);  // the collectives first: they hold the links
    ring_.reset();
  }

  JobPosition reform(at::Tensor& params, const JobPosition& at) {
    drop_ring();
    int unlinked = -1;  // the next node of a formation that broke off because this node could not connect to it
    for (;;) {
      const Epoch e = session_->regroup(at.step, dist_.min_nodes_wait_s, std::exchange(unlinked, -1));
      bool next_unreachable = false;
      try {
        ring_ = link(e, &next_unreachable);
        ring_sync_->relink(ring_);
        const JobPosition p = take_state(params, at, e);
        if (formed_ || e.members.size() > 1 || p.step > 0)
          log::info("[dist] ring epoch {}: node(s) {} (this node {} of {}); state from node {} at step {}{}", e.number,
                    e.nodes(), e.index, e.members.size(), e.root, p.step,
                    p.step < at.step ? fmt::format(" (this node's step {} abandoned)", at.step + 1) : "");
        formed_ = true;
        broken_ = false;
        return p;
      } catch (const Error& err) {
        log::warn("[dist] node {}: ring epoch {} broke off while it formed ({}); asking again", session_->node(), e.number,
                  err.what());
        if (next_unreachable && e.members.size() > 1)
          unlinked = e.members[static_cast<size_t>((e.index + 1) % static_cast<int>(e.members.size()))].node;
        drop_ring();
      }
    }
  }

  std::shared_ptr<Ring> link(const Epoch& e, bool* next_unreachable) {
    auto ring = std::make_shared<Ring>();
    const int n = static_cast<int>(e.members.size()), i = e.index;
    ring->rank = i;
    ring->world = n;
    if (n == 1) return ring;
    const EpochMember &next = e.members[static_cast<size_t>((i + 1) % n)], &prev = e.members[static_cast<size_t>((i + n - 1) % n)];
    RingLinksPlan p;
    p.self = session_->node(), p.next = next.node, p.prev = prev.node;
    p.next_host = next.host, p.next_port = next.port;
    p.next_name = fmt::format("node {} at {}:{}", next.node, next.host, next.port);
    p.prev_name = fmt::format("node {} at {}:{}", prev.node, prev.host, prev.port);
    p.epoch = e.number;
    p.streams = static_cast<int>(dist_.streams);
    p.timeout_s = dist_.timeout_s;
    p.latency_s = latency_s_;
    p.next_unreachable = next_unreachable;
    connect_ring_links(*ring, session_->io(), session_->listener(), session_->key(), p);
    return ring;
  }

  // Every member ends with the root's state; nothing here changes until every sum arrived.
  JobPosition take_state(at::Tensor& params, const JobPosition& at, const Epoch& e) {
    const bool root = e.index == e.root_index();
    FlatAdamW& opt = *ring_sync_->optimizer();
    std::vector<at::Tensor*> live = {&params, &opt.exp_avg(), &opt.exp_avg_sq()};
    std::vector<at::Tensor> got;
    for (at::Tensor* t : live) {
      at::Tensor x = root ? t->clone() : at::zeros_like(*t);
      ring_sync_->sum_exact(x);
      got.push_back(x);
    }
    std::vector<int64_t> v = {at.step, at.tokens, at.data_position, opt.steps()};
    ring_sync_->share_ints(v, root);
    for (size_t k = 0; k < live.size(); ++k) live[k]->copy_(got[k]);
    opt.set_steps(v[3]);
    return {v[0], v[1], v[2]};
  }

  std::shared_ptr<RendezvousSession> session_;  // (declared first: outlives the ring, whose links live in its context)
  DistConfig dist_;
  int device_;
  double latency_s_;
  std::shared_ptr<Ring> ring_;
  std::unique_ptr<RingSync> ring_sync_;
  bool formed_ = false;  // a first epoch was formed
  bool broken_ = false;  // a collective of the current ring failed: the next regroup re-forms
  bool left_ = false;    // leave(): this node is out
};

}  // namespace

std::unique_ptr<GradientSync> make_elastic_ring_sync(const SyncSetup& s, FlatParameters& flat,
                                                     const std::vector<at::Tensor>& params) {
  return std::make_unique<ElasticRingSync>(s, flat, params);
}

}  // namespace syncopate
