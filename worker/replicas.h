// What the training loop sees of the other data-parallel replicas: average the gradient, start
// from rank 0's weights, verify that the replicas still agree. A single process gets an object
// whose methods do nothing, so the loop has no branches for it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/dist_config.h"

namespace syncopate {

class Replicas {
 public:
  virtual ~Replicas() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // True when every replica takes every step together (ring): a step then consumes world x the
  // local batch. False in ps mode, where each worker's step is its own.
  virtual bool synchronous() const = 0;
  // Registers the parameters (registration order) and their [offset, length) in the flat
  // gradient buffer, so that reduction can start per bucket while backward still runs.
  virtual void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                      at::Tensor flat_grads) {}
  // Called before the backward pass whose gradients are to be reduced (the last micro-batch):
  // buckets are reduced as soon as their gradients are final.
  virtual void arm_overlap() {}
  // grads <- mean of grads over replicas (in place); waits for buckets in flight.
  virtual void average_gradients(at::Tensor& grads) = 0;
  // Mean of a scalar over replicas (for logging the global loss).
  virtual double average(double x) = 0;
  // params <- rank 0's params (in place), exactly.
  virtual void broadcast_from_rank0(at::Tensor& params) = 0;
  // Throws syncopate::Error naming the ranks whose params differ from rank 0's.
  virtual void check_identical(const at::Tensor& params, int64_t step) = 0;
  // The checkpoint step to resume from, agreed by every replica of the ring (the newest one all
  // hold); -1 for a fresh start.
  int64_t resume_step() const { return resume_step_; }

 protected:
  int64_t resume_step_ = -1;
};

// mode "none" -> one replica; "ring" -> rendezvous with the other nodes (blocks until they
// arrive) and a TCP ring. `fingerprint` identifies the model and training config; nodes whose
// fingerprints differ are refused. `checkpoints` are the steps this node could resume from.
std::unique_ptr<Replicas> make_replicas(const DistConfig& c, const std::string& token, const std::string& fingerprint,
                                        const std::vector<int64_t>& checkpoints);

}  // namespace syncopate
