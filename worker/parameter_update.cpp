#include "worker/parameter_update.h"

#include <future>
#include <iostream>
#include <mutex>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/flat_adamw.h"
#include "worker/gradient_readiness.h"
#include "worker/ps_client.h"
#include "worker/replicas.h"

namespace syncopate {
namespace {

class LocalUpdate : public ParameterUpdate {
 public:
  explicit LocalUpdate(FlatAdamW& opt) : opt_(opt) {}
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t) override {
    opt_.step(params, grads, lr);
    return 0;
  }

 private:
  FlatAdamW& opt_;
};

class PsUpdate : public ParameterUpdate {
 public:
  PsUpdate(std::unique_ptr<PsClient> c, bool overlap, bool push_in_backward)
      : client_(std::move(c)), overlap_(overlap), push_in_backward_(push_in_backward && !overlap) {}
  ~PsUpdate() override {
    if (inflight_.valid()) inflight_.wait();
    if (ready_ && rounds_ > 0)
      std::cerr << fmt::format("[ps] {} of {} shard pushes left during backward\n", early_, rounds_ * shards_);
  }
  void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
              const at::Tensor& flat_grads) override {
    if (!push_in_backward_) return;
    grads_ = flat_grads;
    ready_ = std::make_unique<GradientReadiness>(params, ranges, client_->shard_bounds(), [this](int k) {
      std::lock_guard<std::mutex> l(mu_);  // hooks may run on autograd worker threads
      client_->push_shard(k, grads_, step_, lr_);
      ++early_;
    });
    shards_ = static_cast<int64_t>(client_->shard_bounds().size()) - 1;
  }
  void arm(double lr, int64_t step) override {
    if (!ready_) return;
    lr_ = lr, step_ = step;
    ready_->arm();
  }
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    if (ready_) {  // shards finished during backward are on their way; gather pushes the others
      ready_->disarm();
      std::lock_guard<std::mutex> l(mu_);
      ++rounds_;
      return client_->gather(grads, params, step, lr);
    }
    if (!overlap_) return client_->push_pull(grads, params, step, lr);
    // The gradient was computed on `params`, whose versions are in_use_ (from the round trip
    // before last); finish the last round trip and adopt its result, then send this gradient.
    if (in_use_.empty()) in_use_ = client_->versions();  // first step: the INIT reply's values
    const std::vector<int64_t> computed_on = in_use_;
    const double stale = finish(params);
    if (!outgoing_.defined()) {
      outgoing_ = at::empty_like(grads);
      incoming_ = at::empty_like(params);
    }
    outgoing_.copy_(grads);
    incoming_.copy_(params);
    inflight_ = std::async(std::launch::async, [this, step, lr, computed_on] {
      return client_->push_pull(outgoing_, incoming_, step, lr, &computed_on);
    });
    return stale;
  }
  void synchronize(at::Tensor& params) override { finish(params); }

 private:
  double finish(at::Tensor& params) {
    if (!inflight_.valid()) return 0;
    const double stale = inflight_.get();  // rethrows a failed round trip
    params.copy_(incoming_);
    in_use_ = client_->versions();
    return stale;
  }
  std::unique_ptr<PsClient> client_;
  bool overlap_, push_in_backward_;
  std::unique_ptr<GradientReadiness> ready_;  // push_in_backward: fires per finished shard range
  at::Tensor grads_;
  std::mutex mu_;
  double lr_ = 0;
  int64_t step_ = 0, early_ = 0, rounds_ = 0, shards_ = 0;  // pushes sent from hooks, of rounds x shards
  at::Tensor outgoing_, incoming_;
  std::vector<int64_t> in_use_;  // parameter versions of the values in params
  std::future<double> inflight_;
};

// One update for the node: replica 0 applies it, the others receive its parameters.
class NodeSharedUpdate : public ParameterUpdate {
 public:
  NodeSharedUpdate(std::unique_ptr<ParameterUpdate> inner, Replicas& replicas) : inner_(std::move(inner)), replicas_(replicas) {}
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    const double staleness = inner_ ? inner_->apply(params, grads, lr, step) : 0.0;
    replicas_.broadcast_from_rank0(params);
    return staleness;
  }
  // Collective: every local replica calls it at the same steps (the trainer's rule is the same on all).
  void synchronize(at::Tensor& params) override {
    if (inner_) inner_->synchronize(params);
    replicas_.broadcast_from_rank0(params);
  }
  void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
              const at::Tensor& flat_grads) override {
    if (inner_) inner_->attach(params, ranges, flat_grads);
  }
  void arm(double lr, int64_t step) override {
    if (inner_) inner_->arm(lr, step);
  }

 private:
  std::unique_ptr<ParameterUpdate> inner_;
  Replicas& replicas_;
};

}  // namespace

std::unique_ptr<ParameterUpdate> make_node_shared_update(std::unique_ptr<ParameterUpdate> inner, Replicas& replicas) {
  if (replicas.local_size() == 1) return inner;
  return std::make_unique<NodeSharedUpdate>(std::move(inner), replicas);
}

std::unique_ptr<ParameterUpdate> make_local_update(FlatAdamW& opt) { return std::make_unique<LocalUpdate>(opt); }
std::unique_ptr<ParameterUpdate> make_ps_update(std::unique_ptr<PsClient> c, bool overlap, bool push_in_backward) {
  return std::make_unique<PsUpdate>(std::move(c), overlap, push_in_backward);
}

}  // namespace syncopate
