// What the training loop sees of the other data-parallel replicas: average the gradient, start
// from rank 0's weights, verify that the replicas still agree. A single process gets an object
// whose methods do nothing, so the loop has no branches for it.
//
// A node runs L local replicas (one thread per GPU, or L CPU replicas), numbered globally
// rank = node_rank * L + local_rank of world = nnodes * L. Inside a node they meet through a
// LocalGroup (NCCL or threads); between nodes through the ring (see NodeAllreduce).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "worker/dist_config.h"

namespace syncopate {
class LocalGroup;

class Replicas {
 public:
  virtual ~Replicas() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int local_rank() const { return 0; }
  virtual int local_size() const { return 1; }
  // Replicas whose batches make up one optimizer step of this replica: world when every replica
  // takes every step together (ring), the node's local replicas in ps mode (each node's step is
  // its own), 1 alone.
  virtual int replicas_per_step() const = 0;
  // One local replica failed with `why`: the others stop waiting for it (local collectives and
  // ring links alike) and throw. Safe to call from any thread, while the others run.
  virtual void abort(const std::string& why) {}
  // Registers the parameters (registration order) and their [offset, length) in the flat
  // gradient buffer, so that reduction can start per bucket while backward still runs.
  virtual void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                      at::Tensor flat_grads) {}
  // Called before the backward pass whose gradients are to be reduced (the last micro-batch):
  // buckets are reduced as soon as their gradients are final.
  virtual void arm_overlap() {}
  // ps mode: reduce the gradient region by region during the armed backward, regions
  // [bounds[r], bounds[r+1]) of flat_grads (the servers' shards); params and ranges as for attach(). Once region r holds the node's mean
  // gradient on local replica 0, on_region_mean(r) runs there (on the communication thread);
  // average_gradients() then only waits for the regions. Every local replica must call it, with
  // the same bounds; on_region_mean may be empty on the others.
  virtual void reduce_during_backward(const std::vector<at::Tensor>& params,
                                      const std::vector<std::pair<int64_t, int64_t>>& ranges, at::Tensor flat_grads,
                                      std::vector<int64_t> bounds, std::function<void(int)> on_region_mean) {}
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

// The node's local replicas, element l for local replica l: one per member of `group` (one when
// it is null), on CUDA device devices[l] (CPU when `devices` is empty). mode "none" -> this node alone; "ring" ->
// rendezvous with the other nodes (blocks until they arrive) and a TCP ring with one lane per
// local replica; "ps" -> nodes that meet only at the parameter servers. `fingerprint`
// identifies the model and training config; nodes whose fingerprints differ are refused.
// `checkpoints` are the steps this node could resume from.
// `group` joins the local replicas (null when there is one; see make_local_group).
std::vector<std::shared_ptr<Replicas>> make_replicas(const DistConfig& c, const std::string& token,
                                                     const std::string& fingerprint,
                                                     const std::vector<int64_t>& checkpoints,
                                                     std::shared_ptr<LocalGroup> group, const std::vector<int>& devices);

}  // namespace syncopate
