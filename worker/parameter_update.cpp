#include "worker/parameter_update.h"

#include <future>
#include <iostream>
#include <mutex>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/flat_adamw.h"
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

// Push/pull to the parameter servers. Runs on local replica 0 of a node (client_) and, with
// push_in_backward, as a silent partner on the others (no client), which only take part in the
// node's region reductions. GPU buffers go through host mirrors: the client reads and writes
// host memory only.
class PsUpdate : public ParameterUpdate {
 public:
  PsUpdate(std::unique_ptr<PsClient> c, bool overlap, bool push_in_backward, Replicas& replicas, int shards)
      : client_(std::move(c)), overlap_(overlap), push_in_backward_(push_in_backward && !overlap), replicas_(replicas),
        shards_(shards) {}
  ~PsUpdate() override {
    if (inflight_.valid()) inflight_.wait();
  }
  // push_in_backward: the node reduces the gradient shard by shard while backward runs
  // (Replicas::reduce_during_backward), and each shard's mean leaves for its server at once.
  void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
              const at::Tensor& flat_grads) override {
    if (!push_in_backward_) return;
    const std::vector<int64_t> bounds = PsClient::even_bounds(flat_grads.numel(), shards_);
    std::function<void(int)> push;
    if (client_)
      push = [this, flat_grads, bounds](int k) {  // on the communication thread, after the region's reduction
        const at::Tensor g = host(flat_grads, host_grads_, bounds[k], bounds[k + 1]);
        std::lock_guard<std::mutex> l(mu_);
        client_->push_shard(k, g, step_, lr_);
      };
    replicas_.reduce_during_backward(params, ranges, flat_grads, bounds, std::move(push));
  }
  void arm(double lr, int64_t step) override {
    std::lock_guard<std::mutex> l(mu_);
    lr_ = lr, step_ = step;
  }
  double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) override {
    if (!client_) return 0;  // local replicas 1..L-1: replica 0 updates for the node
    if (push_in_backward_) {  // every shard left during backward (Replicas::average_gradients waited for them)
      std::lock_guard<std::mutex> l(mu_);
      at::Tensor p = mirror(params, host_params_);
      const double stale = client_->gather(grads.is_cpu() ? grads : host_grads_, p, step, lr);
      if (!params.is_cpu()) params.copy_(p);
      return stale;
    }
    if (!overlap_) {
      at::Tensor p = mirror(params, host_params_);
      const double stale = client_->push_pull(host(grads, host_grads_, 0, grads.numel()), p, step, lr);
      if (!params.is_cpu()) params.copy_(p);
      return stale;
    }
    // The gradient was computed on `params`, whose versions are in_use_ (from the round trip
    // before last); finish the last round trip and adopt its result, then send this gradient.
    if (in_use_.empty()) in_use_ = client_->versions();  // first step: the INIT reply's values
    const std::vector<int64_t> computed_on = in_use_;
    const double stale = finish(params);
    if (!outgoing_.defined()) {  // host buffers: the round trip runs while the next step computes
      outgoing_ = at::empty(grads.sizes(), grads.options().device(at::kCPU));
      incoming_ = at::empty(params.sizes(), params.options().device(at::kCPU));
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
  // t itself on the host; else its host mirror, [lo, hi) copied from t.
  static at::Tensor host(const at::Tensor& t, at::Tensor& mirror, int64_t lo, int64_t hi) {
    if (t.is_cpu()) return t;
    at::Tensor m = PsUpdate::mirror(t, mirror);
    m.slice(0, lo, hi).copy_(t.slice(0, lo, hi));
    return m;
  }
  // t itself on the host; else its (lazily made) host mirror, contents undefined.
  static at::Tensor mirror(const at::Tensor& t, at::Tensor& m) {
    if (t.is_cpu()) return t;
    if (!m.defined()) m = at::empty(t.sizes(), t.options().device(at::kCPU));
    return m;
  }
  double finish(at::Tensor& params) {
    if (!inflight_.valid()) return 0;
    const double stale = inflight_.get();  // rethrows a failed round trip
    params.copy_(incoming_);
    in_use_ = client_->versions();
    return stale;
  }
  std::unique_ptr<PsClient> client_;  // null on local replicas other than 0
  bool overlap_, push_in_backward_;
  Replicas& replicas_;
  int64_t shards_;
  at::Tensor host_grads_, host_params_;  // GPU replicas: host mirrors of the flat buffers
  std::mutex mu_;
  double lr_ = 0;
  int64_t step_ = 0;
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
std::unique_ptr<ParameterUpdate> make_ps_update(std::unique_ptr<PsClient> c, bool overlap, bool push_in_backward,
                                                Replicas& replicas, int shards) {
  return std::make_unique<PsUpdate>(std::move(c), overlap, push_in_backward, replicas, shards);
}

}  // namespace syncopate
