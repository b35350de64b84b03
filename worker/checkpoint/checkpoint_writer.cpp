#include "worker/checkpoint/checkpoint_writer.h"

#include <chrono>

#include <fmt/format.h>

#include "common/check.h"
#include "common/log.h"

namespace syncopate {

namespace {
double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log::error("[checkpoint] the background write of step {} failed: {}", error_step_, e.what());
    }
  }
}

void CheckpointWriter::wait_locked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return !busy_; });
  if (!error_) return;
  std::exception_ptr e = std::exchange(error_, nullptr);
  const int64_t step = error_step_;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    SYN_FAIL(fmt::format("the background write of checkpoint step {} under '{}' failed: {}", step, root_, x.what()),
             "free space or fix the directory's permissions and --resume (the newest complete checkpoint is whole); "
             "checkpoint.background=false writes on the training thread");
  }
}

double CheckpointWriter::submit(CheckpointContents contents) {
  const double t0 = seconds_now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_locked(lock);
    job_ = std::move(contents);
    busy_ = true;
  }
  cv_.notify_all();
  return seconds_now() - t0;
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock);
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
    const double t0 = seconds_now();
    std::string dir;
    std::exception_ptr error;
    try {
      dir = write_checkpoint(root_, c, keep_);
    } catch (...) {
      error = std::current_exception();
    }
    if (const double left = t0 + hold_s_ - seconds_now(); left > 0)  // the modelled storage's write time
      std::this_thread::sleep_for(std::chrono::duration<double>(left));
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
