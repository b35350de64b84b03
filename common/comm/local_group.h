// Collectives among the replicas of one node: one thread per local device, each holding its own
// copy of the model. Every call is collective: each local rank calls it from its own thread with
// its own buffer (same length everywhere), and all ranks issue the same calls in the same order.
//
// Slices: a buffer of n elements is cut into `size()` contiguous slices by the one partition rule
// (Sharding): slice i is [n*i/size, n*(i+1)/size).
//
// Two implementations with the same results:
//  - threads (CPU tensors, shared memory): the reference. Rank i sums slice i over every rank's
//    buffer, in a fixed order, so every rank ends with bit-identical values; used for CPU replicas
//    (dist.local_replicas > 1 on a CPU machine: a multi-GPU node in miniature, for tests).
//  - NCCL (CUDA tensors, one communicator per device, built with SYNCOPATE_NCCL): each call is
//    queued on the calling thread's current stream, like any kernel. Ordering against the
//    computation is the caller's one mechanism, CommStream: the bucket reducer's thread has the
//    communication stream current and fences it; the training thread runs on the compute stream.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/comm/sharding.h"

namespace syncopate {

class LocalGroup {
 public:
  virtual ~LocalGroup() = default;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "threads" or "nccl"
  // t <- sum over local ranks of t (every rank gets the same values).
  virtual void all_reduce_sum(int local_rank, at::Tensor& t) = 0;
  // Slice `local_rank` of t <- that slice summed over local ranks; the other slices of t are left
  // undefined (they may hold partial sums).
  virtual void reduce_scatter_sum(int local_rank, at::Tensor& t) = 0;
  // Every slice i of every rank's t <- slice i of rank i's t.
  virtual void all_gather(int local_rank, at::Tensor& t) = 0;
  // Rank `root`'s t <- sum over local ranks of t; the other ranks' t are left undefined.
  virtual void reduce_sum(int local_rank, at::Tensor& t, int root) = 0;
  // t <- rank `root`'s t.
  virtual void broadcast(int local_rank, at::Tensor& t, int root) = 0;
  // Returns once every local rank has called it and the work this rank queued before it has
  // finished on its device (NCCL calls are asynchronous: a broadcast alone is no barrier).
  virtual void barrier(int local_rank) = 0;
  // Returns once the work queued so far on the calling thread's current stream has finished on
  // local rank `local_rank`'s device: the bounded, abortable form of a stream synchronize, for
  // the host to read what a collective wrote. `what` names the wait in errors. Thread group:
  // returns at once (a CPU collective is done when its call returns).
  virtual void wait_device(int local_rank, const std::string& what) = 0;
  // Called when one local rank failed: every rank waiting in (or later entering) a collective
  // throws syncopate::Error with `why` instead of waiting forever.
  virtual void abort(const std::string& why) = 0;
};

// `devices` empty: a thread group of `cpu_replicas` CPU replicas. Otherwise an NCCL group over
// those CUDA device indices (an error naming the fix when this build has no NCCL). timeout_s
// (dist.local_timeout_s) bounds every wait of a rank for the others and for its device: past it
// the waiting rank fails, naming the wait.
std::unique_ptr<LocalGroup> make_local_group(int cpu_replicas, const std::vector<int>& devices, double timeout_s);

#ifdef SYNCOPATE_NCCL
std::unique_ptr<LocalGroup> make_nccl_group(const std::vector<int>& devices, double timeout_s);
#endif

}  // namespace syncopate
