// The "update" step of the training loop: turns the (reduced, clipped) gradient into new
// parameters. Locally that is the FlatAdamW step; in `ps` mode it is a push of the gradient to
// the parameter servers, which apply the same FlatAdamW on their shards, and a pull of the result.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace syncopate {
class FlatAdamW;
class PsClient;
class Replicas;

class ParameterUpdate {
 public:
  virtual ~ParameterUpdate() = default;
  // Updates params in place for optimizer step `step` at learning rate lr. Returns the update's
  // staleness (parameter versions applied between reading the weights and this update; 0 when
  // synchronous).
  virtual double apply(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) = 0;
  // Brings params fully up to date (waits for an update still in flight). Called before
  // evaluations, checkpoints and at the end.
  virtual void synchronize(at::Tensor& params) {}
  // Where the parameters live in the flat buffers (params[i] is ranges[i] of flat_grads), for
  // updates that start during backward; and arm(): the next backward is the step's last, at
  // learning rate lr for optimizer step `step`. No-ops unless the update pushes during backward.
  virtual void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                      const at::Tensor& flat_grads) {}
  virtual void arm(double lr, int64_t step) {}
};

std::unique_ptr<ParameterUpdate> make_local_update(FlatAdamW& opt);
// Push/pull to the parameter servers. overlap=true: the push/pull of step t runs on a
// communication thread while step t+1 computes on the parameters of step t-1 (one more step of
// staleness, no waiting for the round trip). push_in_backward=true (with overlap=false): the
// node's mean gradient of each shard's range is pushed the moment backward has finished it on
// every local replica (the tail of the flat buffer first; Replicas::reduce_during_backward), so
// pushes overlap the rest of backward; the gradient must then be final before clipping
// (optim.grad_clip=0). client: null on local replicas other than 0 (they only take part in the
// node's reductions). shards: the servers' count. GPU buffers are staged through host memory.
std::unique_ptr<ParameterUpdate> make_ps_update(std::unique_ptr<PsClient> client, bool overlap, bool push_in_backward,
                                                Replicas& replicas, int shards);

// The node's local replicas share one update: local replica 0 runs `inner` (the others pass
// theirs, or null) and every replica then takes replica 0's parameters
// (Replicas::broadcast_from_rank0, inside the node), after apply() and after synchronize() alike
// (an overlapped inner update installs the previous round's parameters in apply and the newest
// in synchronize). With one local replica this is `inner` itself.
std::unique_ptr<ParameterUpdate> make_node_shared_update(std::unique_ptr<ParameterUpdate> inner, Replicas& replicas);

}  // namespace syncopate
