// The locking protocol that lets one local replica abort a node's communicators while the others
// wait inside a collective (issue 28 (3)), kept apart from NCCL so that a CPU test can drive it.
//
// The hazard it answers: NCCL connects lazily at the first collective of each kind and, with a
// blocking communicator, the call itself waits there until every local rank has arrived. A call
// that held the group's lock (shared) across that wait kept abort() (exclusive) out forever when
// a rank never came, e.g. one that ran out of memory while building its model: the only call that
// frees the waiters, ncclCommAbort, never ran.
//
// The protocol: communicators are non-blocking (config.blocking = 0), so every NCCL call returns
// at once (ncclInProgress) and its completion is polled (ncclCommGetAsyncError). run() holds the
// lock shared only while one such short call or poll runs, and releases it between polls; abort()
// first marks the group aborted (no new call or poll starts), then takes the lock exclusively,
// which only waits for a poll already under way, and frees the communicators. Every wait is
// bounded: a call still pending after `timeout_s` fails naming what it waited for.
#pragma once
#include <atomic>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>

namespace syncopate {

class AbortableCalls {
 public:
  enum class Progress { kDone, kPending };
  // timeout_s: the longest one run() may stay pending (dist.local_timeout_s), seconds.
  explicit AbortableCalls(double timeout_s) : timeout_s_(timeout_s) {}

  // Calls step(first) under the lock held shared, first with first=true (issue the non-blocking
  // call), then with first=false (poll it) until it returns kDone, releasing the lock and backing
  // off (spin, then sleeps of up to 1 ms) between polls. Throws syncopate::Error with the abort's
  // reason once the group is aborted (before the first step or between two), and, naming `what`,
  // `timeout_s` and the fix, when it is still pending after timeout_s. Exceptions from `step`
  // propagate.
  void run(const std::string& what, const std::function<Progress(bool first)>& step);

  // Every run() under way or later throws `why` (the first reason is kept). `release` (abort the
  // communicators) runs exactly once, on the first abort, with the lock held exclusively: no step
  // is using a communicator while it runs. Returns once it has run (or was run by an earlier abort).
  void abort(const std::string& why, const std::function<void()>& release);

  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string reason() const;
  double timeout_s() const { return timeout_s_; }

  // Runs f with the lock held shared after checking that the group is not aborted (a single
  // non-blocking call, e.g. reading a communicator's async error).
  template <class F>
  auto shared(F&& f) {
    std::shared_lock<std::shared_mutex> l(mu_);
    throw_if_aborted();
    return f();
  }

 private:
  void throw_if_aborted() const;
  const double timeout_s_;
  std::shared_mutex mu_;           // shared: one step under way; exclusive: release()
  std::atomic<bool> aborted_{false};
  bool released_ = false;          // under mu_ exclusive
  mutable std::mutex why_mu_;
  std::string why_;
};

}  // namespace syncopate
