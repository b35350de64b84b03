// PsLocalSgdSync: local SGD / DiLoCo through the parameter servers (dist.mode=ps,
// dist.sync_every = H > 1). Each node takes H inner AdamW steps on its own (a RingSync of its local
// replicas alone; inner state local and checkpointed), then local replica 0 pushes the node's
// pseudo-gradient Delta = theta_start - theta_now to every shard, at clock = the round, and takes
// the shards' weights as the next round's start. The shards hold the outer weights and the outer
// momentum (a sharded outer optimizer: INIT's update rule "average" or "nesterov") and apply Deltas
// under their consistency rule: BSP averages every node's Delta of a round and applies one outer
// step (synchronous DiLoCo, equal to the ring's); ASP applies each Delta on arrival
// (asynchronous local SGD); SSP bounds how many rounds a node runs ahead. A shard's version
// advances once per outer step, so staleness is counted in outer steps.
//
// dist.elastic: the shards' membership is the job's (docs/PROTOCOL.md "Joining a running job"), in
// rounds: a node joins at a round boundary the shards choose (INIT's join: under BSP the round after
// the one being collected), takes their outer weights as its round's start and keeps its own inner
// AdamW state (a resumed node's checkpointed moments, a new node's zeros). The shards grant each
// push a round of data: H x the node's samples per step, so that the round's inner step k takes
// [grant + k x samples per step, ...) and no sample is taken twice whoever joins or leaves. A node
// that leaves (FINISH: a preemption) or is lost in the middle of a round drops its partial round:
// its inner steps were never pushed, and the BSP round is averaged over the nodes that pushed it.
#include <algorithm>
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/comm/host_staging.h"
#include "common/comm/local_group.h"
#include "common/log.h"
#include "model/flat_parameters.h"
#include "server/ps_client.h"
#include "server/ps_keys.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace {

class PsLocalSgdSync : public GradientSync {
 public:
  PsLocalSgdSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(s.local, s.local_size), every_(s.dist.sync_every), group_(s.group), node_(static_cast<int>(s.dist.node_rank)),
        nodes_(static_cast<int>(s.dist.nnodes)), optim_(s.optim), decay_(flat.decay_ranges()),
        update_{s.dist.outer, s.dist.outer_lr, s.dist.outer_momentum,
                s.dist.outer_delay > 0                                      ? s.dist.outer_delay
                : s.dist.elastic && s.dist.outer == "delayed_nesterov" ? 0  // the live members (the servers count)
                                                                       : s.dist.nnodes},
        inner_(make_ring_sync(node_only(s), flat, params)),
        start_(flat.params.clone()), delta_(at::empty_like(flat.params)), device_(s.device), elastic_(s.dist.elastic),
        step_samples_(s.samples_per_step) {
    if (s.dist.wire == "int8") residual_ = at::zeros({flat.numel()}, at::kFloat);  // checkpointed (state())
    if (local_ == 0) {  // local replica 0 talks to the servers for its node
      PsClientOptions o = ps_client_options(s);
      o.samples_per_step = every_ * s.samples_per_step;  // elastic: one grant per push is a round's data
      client_ = std::make_unique<PsClient>(PsClient::parse_endpoints(s.dist.servers), s.token, node_, nodes_, o);
    }
  }

  int rank() const override { return node_ * local_size_ + local_; }
  int world() const override { return nodes_ * local_size_; }
  int replicas_per_step() const override { return local_size_; }

  // INIT registers the node at the round it is in. At a round boundary the node takes the shards'
  // weights (the first node's INIT, or the current outer weights) and starts the round there; in
  // the middle of a round (a resume) it keeps its own weights and the round's start from the
  // checkpoint (state()). dist.elastic: the node joins at the round boundary the shards name (a
  // resume's partial round is dropped) and always starts there from their weights.
  void start(at::Tensor& params, int64_t step) override {
    const bool boundary = elastic_ || step % every_ == 0;
    if (client_) {
      // INIT's values create shards that do not exist yet: the outer weights (mid-round, the round's
      // start from the checkpoint, not the inner weights); its reply lands here, not in params.
      at::Tensor host = host_.copy_of(step % every_ == 0 ? params : start_);
      client_->init(host, decay_, optim_, step / every_, update_);
      if (switched_) check_switched_shards(*client_, step);
      if (residual_.defined()) client_->set_residuals(residual_.data_ptr<float>());  // owed at the checkpoint
      if (boundary) HostStaging::to_device(params, host);
      per_version_ = pushes_per_version(*client_, nodes_);
      if (elastic_) joined_ = client_->start_clock() * every_, grant_ = client_->data_grant();
    }
    if (group_) group_->broadcast(local_, params, 0);
    if (boundary) start_.copy_(params);
    if (elastic_) share_membership(group_.get(), local_, device_, joined_, grant_);
    next_ = elastic_ ? joined_ : step;
  }
  int64_t joined_step() const override { return elastic_ ? joined_ : -1; }
  // The first sample of the node's next inner step: its round's grant, k steps of samples in.
  int64_t data_grant() const override {
    return elastic_ && grant_ >= 0 ? grant_ + (next_ % every_) * step_samples_ : -1;
  }
  void begin_last_backward(double lr, int64_t step) override { inner_->begin_last_backward(lr, step); }
  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    StepSync r = inner_->finish_step(params, grads, lr, step);  // the node's inner step
    r.round = (step + 1) / every_;
    next_ = step + 1;
    if ((step + 1) % every_ != 0) return r;
    if (client_) {
      at::sub_out(delta_, start_, params);  // the node's pseudo-gradient
      r.outer_norm = delta_.norm().item<double>();
      const PsClientCounters mark = client_->counters();
      const at::Tensor d = delta_host_.to_host(delta_);
      at::Tensor p = params_host_.for_(params);
      r.staleness = push_pull(*client_, d, p, step / every_, 0.0);  // clock = the round
      HostStaging::to_device(params, p);
      r.wire_bytes = client_->counters().bytes_sent - mark.bytes_sent;
      r.wire_bytes_received = client_->counters().bytes_received - mark.bytes_received;
      grant_ = client_->data_grant();  // elastic: the next round's data
    }
    if (group_) group_->broadcast(local_, params, 0);  // the node's replicas take replica 0's new start
    if (elastic_) share_membership(group_.get(), local_, device_, joined_, grant_);
    start_.copy_(params);
    return r;
  }
  void synchronize(at::Tensor& params) override { inner_->synchronize(params); }
  double average(double x, bool* any) override { return inner_->average(x, any); }
  void check_identical(const at::Tensor& params, int64_t step) override { inner_->check_identical(params, step); }
  FlatAdamW* optimizer() override { return inner_->optimizer(); }
  int64_t job_tokens(int64_t node_tokens, int64_t per_step) const override {
    return ps_job_tokens(client_.get(), per_version_, every_, node_tokens, per_step, nodes_);
  }
  // Mid-round a node holds its inner weights; the servers' outer weights it last took are the round's start.
  ShippedWeights shipped(const at::Tensor&) override { return {start_, "servers"}; }
  ShippedWeights final_weights(at::Tensor& params, int64_t per_step, const WaitProgress& while_waiting) override {
    return client_ ? ps_final_weights(*client_, final_host_, start_, per_version_ * every_ * per_step, while_waiting)
                   : shipped(params);
  }
  void restart_state(const at::Tensor& params) override {
    start_.copy_(params);
    if (residual_.defined()) residual_.zero_();
    switched_ = true;
  }
  // The round's start, and with the int8 wire the error-feedback residuals (gathered from the client).
  std::vector<std::pair<std::string, at::Tensor>> state() override {
    if (!residual_.defined()) return {{"outer_start", start_}};
    if (client_ && client_->parts() > 0) client_->residuals(residual_.data_ptr<float>());
    return {{"outer_start", start_}, {"ps_residual", residual_}};
  }
  void finish(int64_t step) override {
    if (client_) client_->finish(step / every_);  // the shards count this node's clock in rounds
  }
  SyncCounters counters() const override {
    SyncCounters c = inner_->counters();
    c.wire_bytes = client_ ? client_->counters().bytes_sent : 0;
    c.wire_bytes_received = client_ ? client_->counters().bytes_received : 0;
    return c;
  }

 private:
  int64_t every_;
  std::shared_ptr<LocalGroup> group_;
  int node_, nodes_;
  AdamWConfig optim_;  // INIT carries it (the shards' AdamW is unused under an outer update)
  std::vector<std::pair<int64_t, int64_t>> decay_;
  ShardUpdate update_;
  std::unique_ptr<GradientSync> inner_;
  std::unique_ptr<PsClient> client_;  // local replica 0 only
  at::Tensor residual_;  // int8 wire: the client's error-feedback residuals, flat (local replica 0's are the real ones)
  bool switched_ = false;  // resumed from another synchronization's checkpoint (restart_state)
  at::Tensor start_, delta_;
  HostStaging host_, delta_host_, params_host_, final_host_;
  int64_t per_version_ = 0;  // node rounds one shard version stands for (job_tokens); 0: unknown
  int device_;
  bool elastic_;
  int64_t step_samples_;      // training samples one inner step of this node takes
  int64_t joined_ = -1;       // elastic: the step (a round boundary) the node joined the job at
  int64_t grant_ = -1;        // elastic: the first sample of the node's current round (-1: none)
  int64_t next_ = 0;          // the node's next inner step
};

}  // namespace

std::unique_ptr<GradientSync> make_ps_local_sgd_sync(const SyncSetup& s, FlatParameters& flat,
                                                     const std::vector<at::Tensor>& params) {
  return std::make_unique<PsLocalSgdSync>(s, flat, params);
}

}  // namespace syncopate
