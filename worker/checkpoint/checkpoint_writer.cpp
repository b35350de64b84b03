#include "worker/checkpoint/checkpoint_writer.h"

#include <memory>

#include <fmt/format.h>

#include "common/check.h"
#include "worker/metrics/metrics_log.h"

namespace syncopate {

CheckpointWriter::CheckpointWriter(std::string root, int64_t keep, double hold_s)
    : root_(std::move(root)), keep_(keep), hold_s_(hold_s) {}

CheckpointWriter::~CheckpointWriter() = default;  // task_ waits for the write in flight and logs a failure

void CheckpointWriter::rethrow_failure() {
  BackgroundTask::Failure f;
  if (!task_.take_failure(&f)) return;
  SYN_FAIL(fmt::format("the background write of {} under '{}' failed: {}", f.label, root_, f.what),
           "free space or fix the directory's permissions and --resume (the newest complete checkpoint is whole); "
           "checkpoint.background=false writes on the training thread");
}

double CheckpointWriter::wait() {
  const double waited = task_.wait();
  rethrow_failure();
  return waited;
}

void CheckpointWriter::submit(CheckpointContents contents) {
  wait();
  const int64_t step = contents.step;
  // (A shared_ptr: std::function needs a copyable callable; the snapshot itself is never copied.)
  auto c = std::make_shared<CheckpointContents>(std::move(contents));
  task_.submit(fmt::format("checkpoint step {}", step), [this, c] {
    const double t0 = now_seconds();
    const std::string dir = write_checkpoint(root_, *c, keep_, [&] { hold_checkpoint_write(t0, hold_s_); });
    std::lock_guard<std::mutex> lock(mu_);
    last_written_ = dir;
  });
}

std::string CheckpointWriter::last_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_written_;
}

}  // namespace syncopate
