// Checkpoints written in the background (checkpoint.background): at a step boundary the trainer
// takes a detached snapshot (a host copy of the weights, moments and synchronization state, what
// torch.distributed.checkpoint's async_save stages), hands it to this writer and goes on training
// while one thread writes it atomically (write_checkpoint). What a node resumes from is the newest
// checkpoint whose write completed: a kill while one is in flight resumes from the one before, as a
// kill during a synchronous write does. The modelled write time (hold_s) is held before the
// checkpoint is renamed into place, so it becomes durable at the end of its modelled write.
//
// At most one write is in flight, and the trainer waits for it (wait()) before it takes the next
// snapshot: a disk slower than the checkpoint interval slows training to its pace, and at most one
// snapshot is held in memory beside the live state. A write that failed is reported by the next
// wait() or submit(), with its step, once.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

#include "common/background_task.h"
#include "worker/checkpoint/checkpoint.h"

namespace syncopate {

class CheckpointWriter {
 public:
  // root: the checkpoint directory; keep: checkpoints kept (as write_checkpoint's);
  // hold_s: every write takes at least this long before it commits (emulate.checkpoint_s: a large
  // model's write on the modelled cluster's storage; 0 = as long as it takes).
  CheckpointWriter(std::string root, int64_t keep, double hold_s);
  ~CheckpointWriter();  // waits for the write in flight (a failure then is logged)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits until nothing is in flight and returns how long it waited, seconds (the time a step lost
  // to the writer); throws syncopate::Error naming the step of a write that failed.
  double wait();
  // Starts writing `contents` (after waiting for a write still in flight, as wait()).
  void submit(CheckpointContents contents);
  // The directory of the newest checkpoint this writer committed ("" = none yet).
  std::string last_written() const;

 private:
  void rethrow_failure();

  const std::string root_;
  const int64_t keep_;
  const double hold_s_;
  mutable std::mutex mu_;    // last_written_ (the task's thread sets it)
  std::string last_written_;
  BackgroundTask task_;      // last: its thread ends (the write in flight done) before the members above go
};

}  // namespace syncopate
