// A reusable barrier for the N threads of one node's replicas that turns into an error once
// aborted (a replica failed: the others must not wait for it forever).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/check.h"

namespace syncopate {

class AbortableBarrier {
 public:
  explicit AbortableBarrier(int n) : n_(n) {}
  // Returns once all n threads have arrived; throws syncopate::Error naming the abort's reason
  // if the barrier was (or becomes) aborted first.
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = gen_;
    if (aborted_.empty() && ++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(l, [&] { return gen_ != gen || !aborted_.empty(); });
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
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t gen_ = 0;
  std::string aborted_;
};

}  // namespace syncopate
