#include "worker/checkpoint/checkpoint_writer.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/log.h"
#include "worker/metrics/metrics_log.h"

namespace syncopate {

namespace {
std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
}  // namespace

CheckpointWriter::CheckpointWriter(std::string root, int64_t keep, double hold_s)
    : root_(std::move(root)), keep_(keep), hold_s_(hold_s), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (error_) log::error("[checkpoint] the background write of step {} failed: {}", error_step_, what_of(error_));
}

void CheckpointWriter::wait_locked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return !busy_; });
  if (!error_) return;
  const std::string what = what_of(std::exchange(error_, nullptr));
  SYN_FAIL(fmt::format("the background write of checkpoint step {} under '{}' failed: {}", error_step_, root_, what),
           "free space or fix the directory's permissions and --resume (the newest complete checkpoint is whole); "
           "checkpoint.background=false writes on the training thread");
}

double CheckpointWriter::wait() {
  const double t0 = now_seconds();
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock);
  return now_seconds() - t0;
}

void CheckpointWriter::submit(CheckpointContents contents) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_locked(lock);
    job_ = std::move(contents);
    busy_ = true;
  }
  cv_.notify_all();
}

std::string CheckpointWriter::last_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_written_;
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || busy_; });
    if (!busy_) return;  // stop_ with nothing in flight
    const CheckpointContents& c = *job_;  // submit() does not touch job_ while busy_
    lock.unlock();
    const double t0 = now_seconds();
    std::string dir;
    std::exception_ptr error;
    try {
      dir = write_checkpoint(root_, c, keep_, [&] { hold_checkpoint_write(t0, hold_s_); });
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error) {
      error_ = error;
      error_step_ = c.step;
    } else {
      last_written_ = dir;
    }
    job_.reset();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace syncopate
