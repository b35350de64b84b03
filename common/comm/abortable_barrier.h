// A reusable barrier for the N threads of one node's replicas that turns into an error once
// aborted (a replica failed: the others must not wait for it forever), or when the last thread
// has not arrived within a bound (a replica that hangs without failing).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/check.h"

namespace syncopate {

class AbortableBarrier {
 public:
  // timeout_s: the longest a thread waits for the others (dist.local_timeout_s), seconds.
  AbortableBarrier(int n, double timeout_s) : n_(n), timeout_(std::chrono::duration<double>(timeout_s)) {}
  // Returns once all n threads have arrived; throws syncopate::Error naming the abort's reason
  // if the barrier was (or becomes) aborted first, or naming the bound when it passes first (the
  // waiting thread then leaves; its replica fails, and its failure aborts the barrier for the rest).
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = gen_;
    if (aborted_.empty() && ++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    const bool met = cv_.wait_for(l, timeout_, [&] { return gen_ != gen || !aborted_.empty(); });
    if (!met) {
      const int arrived = waiting_--;
      SYN_FAIL(fmt::format("{} of {} local replicas reached a collective within {:g} s; the others never came", arrived,
                           n_, timeout_.count()),
               "see the other replicas' errors above; if a replica was busy longer than that (a long evaluation or "
               "checkpoint on local replica 0), raise dist.local_timeout_s");
    }
    SYN_CHECK(gen_ != gen, "local collective aborted: " + aborted_, "see the first error above");
  }
  // Releases every waiter (and every later arrival) with an error; the first reason is kept.
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> l(mu_);
    if (aborted_.empty()) aborted_ = why.empty() ? "a local replica failed" : why;
    cv_.notify_all();
  }

 private:
  const int n_;
  const std::chrono::duration<double> timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t gen_ = 0;
  std::string aborted_;
};

}  // namespace syncopate
