// Checkpoints written in the background (checkpoint.background): at a step boundary the trainer
// takes a detached snapshot (a CPU copy of the weights, moments and synchronization state, what
// torch.distributed.checkpoint's async_save stages), hands it to this writer and goes on training
// while one thread writes it atomically (write_checkpoint). What a node resumes from is the newest
// checkpoint whose write completed: a kill while one is in flight resumes from the one before, as a
// kill during a synchronous write does.
//
// At most one write is in flight: submit() waits for the previous one first (a disk slower than
// the checkpoint interval slows training down to its pace instead of queueing snapshots in
// memory). A write that failed is reported by the next submit() or wait(), with its step.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "worker/checkpoint/checkpoint.h"

namespace syncopate {

class CheckpointWriter {
 public:
  // root: the checkpoint directory; keep: checkpoints kept (as save_checkpoint's);
  // hold_s: every write takes at least this long (emulate.checkpoint_s: a large model's write on
  // the modelled cluster's storage; 0 = as long as it takes).
  CheckpointWriter(std::string root, int64_t keep, double hold_s);
  ~CheckpointWriter();  // waits for the write in flight (a write that fails then is logged)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the write in flight (rethrowing its error), then starts writing `contents`.
  // Returns how long it waited, seconds (the time the step lost to the writer).
  double submit(CheckpointContents contents);
  // Waits until nothing is in flight; throws syncopate::Error naming the step of a failed write.
  void wait();
  // The directory of the newest checkpoint this writer completed ("" = none yet).
  std::string last_written() const;

 private:
  void run();
  void wait_locked(std::unique_lock<std::mutex>& lock);

  const std::string root_;
  const int64_t keep_;
  const double hold_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<CheckpointContents> job_;  // the write in flight (taken by the thread, kept until done)
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  int64_t error_step_ = -1;
  std::string last_written_;
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace syncopate
