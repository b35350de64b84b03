// The "update" step of the training loop: turns the (reduced, clipped) gradient into new
// parameters. Locally that is the FlatAdamW step; in `ps` mode it is a push of the gradient to
// the parameter servers, which apply the same FlatAdamW on their shards, and a pull of the result.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

namespace syncopate {
class FlatAdamW;
class PsClient;

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
};

std::unique_ptr<ParameterUpdate> make_local_update(FlatAdamW& opt);
// overlap=true: the push/pull of step t runs on a communication thread while step t+1 computes on
// the parameters of step t-1 (one more step of staleness, no waiting for the round trip).
std::unique_ptr<ParameterUpdate> make_ps_update(std::unique_ptr<PsClient> client, bool overlap);

}  // namespace syncopate
