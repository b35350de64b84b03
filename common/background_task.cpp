#include "common/background_task.h"

#include "common/exception_text.h"
#include "common/log.h"
#include "common/monotonic_clock.h"

namespace syncopate {

BackgroundTask::BackgroundTask() : thread_([this] { run(); }) {}

BackgroundTask::~BackgroundTask() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (failed_) log::error("[background] {} failed: {}", failure_.label, failure_.what);
}

void BackgroundTask::submit(std::string label, std::function<void()> task) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    task_ = std::move(task);
    label_ = std::move(label);
    busy_ = true;
  }
  cv_.notify_all();
}

double BackgroundTask::wait() {
  const double t0 = monotonic_seconds();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_; });
  return monotonic_seconds() - t0;
}

bool BackgroundTask::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !busy_;
}

int64_t BackgroundTask::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

bool BackgroundTask::take_failure(Failure* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) return false;
  failed_ = false;
  if (out) *out = std::move(failure_);
  failure_ = {};
  return true;
}

void BackgroundTask::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || busy_; });
    if (!busy_) return;  // stop_ with nothing in flight
    std::function<void()> task;
    task.swap(task_);
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // what it captured (a snapshot) is freed before the owner hears it is done
    lock.lock();
    if (error) failed_ = true, failure_ = {label_, exception_text(error)};
    ++finished_;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace syncopate
