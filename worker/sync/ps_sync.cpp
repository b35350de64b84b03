// PsSync: nodes meet only at the parameter servers. The node's local replicas average their
// gradient in the node (the local group); local replica 0 pushes shard k's range to server k
// (all shards in flight at once) and writes the servers' reply into the parameters, which the
// node's other replicas then take from it. The servers hold the optimizer: a ps replica keeps
// parameters and gradients and no AdamW state (optimizer() is null; checkpoints carry none).
//
// Three ways to send (dist.*):
//   default                after backward, wait for the round trip;
//   ps_overlap             the round trip of step t runs on a thread while step t+1 computes on
//                          the parameters of step t-1 (one more step of staleness);
//   ps_push_in_backward    a BucketReducer over the parts' ranges: each range is reduced in the
//                          node the moment backward has finished it on every local replica, and
//                          replica 0 pushes it at once (the gradient must be final before
//                          clipping: optim.grad_clip=0).
// GPU buffers go through host staging (pinned, reused): the client reads and writes host memory.
#include <algorithm>
#include <future>
#include <mutex>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/comm/host_staging.h"
#include "common/comm/local_group.h"
#include "common/comm/sharding.h"
#include "common/log.h"
#include "model/flat_parameters.h"
#include "server/ps_client.h"
#include "server/ps_keys.h"
#include "worker/sync/bucket_reducer.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace {

class PsSync : public GradientSync {
 public:
  PsSync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params)
      : GradientSync(s.local, s.local_size), group_(s.group), device_(s.device), node_(static_cast<int>(s.dist.node_rank)),
        nodes_(static_cast<int>(s.dist.nnodes)), optim_(s.optim), decay_(flat.decay_ranges()),
        skip_(s.skip_grad_norm), overlap_(s.dist.ps_overlap), push_in_backward_(s.dist.ps_push_in_backward && !s.dist.ps_overlap),
        elastic_(s.dist.elastic), numel_(flat.numel()), job_steps_(s.job_steps) {
    const auto endpoints = PsClient::parse_endpoints(s.dist.servers);
    if (local_ == 0) {  // local replica 0 talks to the servers for its node
      client_ = std::make_unique<PsClient>(endpoints, s.token, node_, nodes_, ps_client_options(s));
    }
    if (s.dist.wire == "int8") residual_ = at::zeros({flat.numel()}, at::kFloat);  // checkpointed (state())
    if (push_in_backward_) {
      bounds_ = PsClient::part_bounds(flat.numel(), static_cast<int>(endpoints.size()), partition_elems(s.dist));
      flat_grads_ = flat.grads;
      regions_ = std::make_unique<BucketReducer>(params, parameter_ranges(flat), flat.grads, bounds_, device_,
                                                 [this](int k, at::Tensor region) { reduce_and_push(k, region); });
    }
  }
  ~PsSync() override {
    // The reducer's communication thread runs reduce_and_push, which uses this object's members
    // (mu_, tickets_, the client): join it before any of them is destroyed.
    regions_.reset();
    if (inflight_.valid()) inflight_.wait();
  }

  int rank() const override { return node_ * local_size_ + local_; }
  int world() const override { return nodes_ * local_size_; }
  int replicas_per_step() const override { return local_size_; }

  // INIT gives every worker the same start: the first worker's values, or the servers' current ones.
  void start(at::Tensor& params, int64_t step) override {
    if (client_) {
      at::Tensor host = params_host_.to_host(params);
      client_->init(host, decay_, optim_, step, {}, carried_.get());  // (carried_: a switch's AdamW state)
      if (switched_) check_switched_shards(*client_, step);
      carried_.reset();
      if (residual_.defined()) client_->set_residuals(residual_.data_ptr<float>());  // owed at the checkpoint
      HostStaging::to_device(params, host);
      if (elastic_) joined_ = client_->start_clock();
      if (const int64_t applied = client_->applied_clock(); !elastic_ && applied >= step)
        log::warn("[ps] the servers applied this node's steps up to {} before it resumed at {}: those steps are "
                  "recomputed and answered with the servers' parameters, not applied again", applied, step);
    }
    share_node_params(params);
    share_membership();
    if (client_) per_version_ = pushes_per_version(*client_, nodes_);
    // BSP (the INIT replies carry a round): the node can learn that the job's rounds reached its
    // budget. Agreed once, so that SSP and ASP nodes pay no per-step agreement for it.
    bsp_ = client_ && client_->job_round() >= 0;
    share_flag(bsp_, "the servers' consistency");
  }
  int64_t joined_step() const override { return elastic_ ? joined_ : -1; }
  int64_t data_grant() const override { return elastic_ ? grant_ : -1; }
  // With the int8 wire, the error-feedback residuals (what rounding dropped, owed to the next push):
  // a resumed worker owes what it owed at its checkpoint. Gathered from the client when saving.
  std::vector<std::pair<std::string, at::Tensor>> state() override {
    if (!residual_.defined()) return {};
    if (inflight_.valid()) inflight_.wait();  // ps_overlap: the round trip in flight encodes into them
    if (client_ && client_->parts() > 0) client_->residuals(residual_.data_ptr<float>());
    return {{"ps_residual", residual_}};
  }
  void begin_last_backward(double lr, int64_t step) override {
    std::lock_guard<std::mutex> l(mu_);
    lr_ = lr, step_ = step;
    tickets_.clear();
    if (client_) mark_ = client_->counters();
    if (regions_) regions_->arm();
  }

  StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    StepSync r;
    const bool pushed = regions_ && regions_->finish();  // every shard left during backward (on replica 0)
    if (!pushed && group_) {  // the node's mean on every local replica
      group_->all_reduce_sum(local_, grads);
      grads.div_(local_size_);
      group_->wait_device(local_, "the node's gradient mean");  // before the norm is read on the host
    }
    r.grad_norm = clip_grad_norm(grads, optim_.grad_clip);  // the same on the node's replicas
    // The guard: a non-finite (or too large) gradient is not sent. With ps_push_in_backward it has
    // left already, and the servers refuse it (the run then fails naming it).
    r.skipped = !pushed && skip_update(r.grad_norm, skip_);
    if (client_ && r.skipped) {
      if (overlap_) r.staleness = finish_inflight(params);  // adopt the round trip in flight, send nothing
      if (elastic_) client_->skip_data();  // the next step takes fresh samples, not this step's again
    } else if (client_) {
      if (pushed) r.staleness = wait_all(params);
      else if (overlap_) r.staleness = overlapped_round_trip(params, grads, lr, step);
      else r.staleness = round_trip(params, grads, lr, step);
      r.wire_bytes = client_->counters().bytes_sent - mark_.bytes_sent;
      r.wire_bytes_received = client_->counters().bytes_received - mark_.bytes_received;
      // BSP: the job's clocks are its steps; where the servers' rounds reached the budget while this
      // node is behind it, its steps left have nothing to add. (round_: of the last round trip this
      // thread finished; with ps_overlap the one before, read after it ended, never while one runs.)
      r.job_done = bsp_ && job_steps_ > 0 && step + 1 < job_steps_ && round_ >= job_steps_;
    }
    share_node_params(params);
    share_membership();
    if (bsp_) share_flag(r.job_done, "the job's end");
    return r;
  }
  void synchronize(at::Tensor& params) override {
    if (client_) finish_inflight(params);
    share_node_params(params);
  }
  // Host memory: the client sends it from there (replica 0's; the others' load is dropped at start()).
  FlatAdamW* carried_optimizer() override {
    if (!carried_) carried_ = std::make_unique<FlatAdamW>(optim_, numel_, decay_, at::TensorOptions().dtype(at::kFloat));
    return carried_.get();
  }
  void restart_state(const at::Tensor&) override {
    switched_ = true;
    if (residual_.defined()) residual_.zero_();  // nothing owed: the checkpoint was another mode's
  }
  double average(double x, bool* any) override { return node_average(group_.get(), local_, local_size_, device_, x, any); }
  void check_identical(const at::Tensor& params, int64_t step) override {
    if (!group_) return;
    check_replicas_identical(params, step, local_, local_size_, local_size_, device_,
                             [&](at::Tensor& t) { group_->all_reduce_sum(local_, t); });
  }
  void finish(int64_t step) override {
    if (client_) client_->finish(step);
  }
  void set_release_gate(std::function<void(double)> gate) override {
    if (regions_) regions_->set_gate(std::move(gate));
  }
  int64_t job_tokens(int64_t node_tokens, int64_t per_step) const override {
    return ps_job_tokens(client_.get(), per_version_, 1, node_tokens, per_step, nodes_);
  }
  // After synchronize() the node holds what the servers last replied.
  ShippedWeights shipped(const at::Tensor& params) override { return {params, "servers"}; }
  ShippedWeights final_weights(at::Tensor& params, int64_t per_step, const WaitProgress& while_waiting) override {
    return client_ ? ps_final_weights(*client_, final_host_, params, per_version_ * per_step, while_waiting) : shipped(params);
  }
  SyncCounters counters() const override {
    SyncCounters c;
    if (regions_) c.regions = regions_->regions(), c.launched_early = regions_->launched_early(), c.reduced = regions_->reduced();
    if (client_) c.wire_bytes = client_->counters().bytes_sent, c.wire_bytes_received = client_->counters().bytes_received;
    return c;
  }

 private:
  // The node's replicas take local replica 0's parameters.
  void share_node_params(at::Tensor& params) {
    if (group_) group_->broadcast(local_, params, 0);
  }
  // dist.elastic: the clock the node joined at and its data grant, on every local replica.
  void share_membership() {
    if (!elastic_) return;
    if (client_) grant_ = client_->data_grant();
    syncopate::share_membership(group_.get(), local_, device_, joined_, grant_);
  }

  // Local replica 0's flag (the one with a client) on every local replica of the node.
  void share_flag(bool& flag, const char* what) {
    if (!group_) return;
    std::vector<int64_t> v = {flag ? 1 : 0};
    share_ints(v, local_ == 0, replica_options(device_), [&](at::Tensor& t) {
      group_->all_reduce_sum(local_, t);
      group_->wait_device(local_, what);  // bounded, before the host reads it
    });
    flag = v[0] > 0;
  }

  // push_in_backward, on the communication thread: the node's mean of part k's range (a shard's, or
  // one partition of it) on local replica 0, which pushes it at once.
  void reduce_and_push(int k, at::Tensor region) {
    if (group_) {
      group_->reduce_sum(local_, region, 0);
      if (local_ == 0) region.div_(local_size_);
      group_->wait_device(local_, "the node's gradient region");  // before the host copies and pushes it
    }
    if (!client_) return;
    // Each shard's own slice of the staged gradient (the flat buffer itself on CPU): a push in
    // flight is never overwritten by the next region's copy.
    at::Tensor host = grads_host_.for_(flat_grads_).slice(0, bounds_[k], bounds_[k + 1]);
    if (!region.is_cpu()) host.copy_(region);
    std::lock_guard<std::mutex> l(mu_);
    tickets_.push_back(client_->push(k, host, step_, lr_));
  }
  double wait_all(at::Tensor& params) {
    std::lock_guard<std::mutex> l(mu_);
    at::Tensor host = params_host_.for_(params);
    double stale = 0;
    for (const PsTicket& t : tickets_) {
      at::Tensor into = host.slice(0, client_->bounds()[t.part], client_->bounds()[t.part + 1]);
      stale += static_cast<double>(client_->wait(t, into).staleness);
    }
    HostStaging::to_device(params, host);
    round_ = client_->job_round();
    const size_t n = tickets_.size();
    tickets_.clear();
    return n ? stale / static_cast<double>(n) : 0;
  }
  double round_trip(at::Tensor& params, const at::Tensor& grads, double lr, int64_t step) {
    const at::Tensor g = grads_host_.to_host(grads);
    at::Tensor p = params_host_.for_(params);
    const double stale = push_pull(*client_, g, p, step, lr);
    round_ = client_->job_round();
    HostStaging::to_device(params, p);
    return stale;
  }
  // The gradient was computed on `params`, whose versions are in_use_ (from the round trip
  // before last); finish the last round trip and adopt its result, then send this gradient.
  double overlapped_round_trip(at::Tensor& params, const at::Tensor& grads, double lr, int64_t step) {
    if (in_use_.empty()) in_use_ = client_->versions();  // first step: the INIT reply's values
    const std::vector<int64_t> computed_on = in_use_;
    const double stale = finish_inflight(params);
    const at::Tensor out = outgoing_.copy_of(grads);
    in_ = incoming_.copy_of(params);
    inflight_ = std::async(std::launch::async, [this, out, step, lr, computed_on] {
      return push_pull(*client_, out, in_, step, lr, &computed_on);
    });
    return stale;
  }
  double finish_inflight(at::Tensor& params) {
    if (!inflight_.valid()) return 0;
    const double stale = inflight_.get();  // rethrows a failed round trip
    round_ = client_->job_round();           // (nothing in flight now)
    params.copy_(in_);
    in_use_ = client_->versions();
    return stale;
  }

  std::shared_ptr<LocalGroup> group_;
  int device_, node_, nodes_;
  AdamWConfig optim_;  // sent to the servers in INIT (they run the optimizer); grad_clip applies here
  std::vector<std::pair<int64_t, int64_t>> decay_;
  double skip_;
  bool overlap_, push_in_backward_;
  bool elastic_;
  int64_t joined_ = -1, grant_ = -1;  // dist.elastic: the clock this node joined at, its next step's data grant
  std::unique_ptr<PsClient> client_;  // local replica 0 only
  at::Tensor residual_;               // int8 wire: the client's residuals, flat (local replica 0's are the real ones)
  bool switched_ = false;             // resumed from another synchronization's checkpoint (restart_state)
  std::unique_ptr<FlatAdamW> carried_;  // a switch from a mode whose nodes held AdamW: its state, for INIT
  int64_t numel_ = 0;                  // the flat parameter vector's length
  int64_t job_steps_ = 0;              // SyncSetup::job_steps
  bool bsp_ = false;                   // the servers run BSP (their INIT replies carry a round): on every local replica
  int64_t round_ = -1;                 // PsClient::job_round() after the last round trip finished (local replica 0)
  std::vector<int64_t> bounds_;       // push_in_backward: the parts' ranges (PsClient::part_bounds)
  std::unique_ptr<BucketReducer> regions_;
  at::Tensor flat_grads_;             // the flat gradient buffer (push_in_backward stages slices of it)
  HostStaging grads_host_, params_host_, outgoing_, incoming_, final_host_;
  at::Tensor in_;                     // overlap: the parameters the round trip in flight writes
  std::mutex mu_;  // lr_, step_, tickets_: set by the loop, read on the communication thread
  double lr_ = 0;
  int64_t step_ = 0;
  PsClientCounters mark_;  // the client's counters when the step's pushes began
  std::vector<PsTicket> tickets_;
  std::vector<int64_t> in_use_;  // overlap: parameter versions of the values in params
  std::future<double> inflight_;
  int64_t per_version_ = 0;  // node steps one shard version stands for (job_tokens); 0: unknown
};

}  // namespace

std::unique_ptr<GradientSync> make_ps_sync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params) {
  return std::make_unique<PsSync>(s, flat, params);
}

}  // namespace syncopate
