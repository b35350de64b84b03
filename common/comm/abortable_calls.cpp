#include "common/comm/abortable_calls.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

std::string AbortableCalls::reason() const {
  std::lock_guard<std::mutex> l(why_mu_);
  return why_;
}

void AbortableCalls::throw_if_aborted() const {
  if (aborted()) SYN_FAIL("local collective aborted: " + reason(), "see the first error above");
}

void AbortableCalls::run(const std::string& what, const std::function<Progress(bool first)>& step) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_s_));
  for (int polls = 0;; ++polls) {
    throw_if_aborted();  // before taking the lock: an abort waiting for it is not kept out by new polls
    if (shared([&] { return step(polls == 0); }) == Progress::kDone) return;
    if (clock::now() > deadline)
      SYN_FAIL(fmt::format("{} still pending after {:g} s: a local replica never reached it, or its device hangs",
                           what, timeout_s_),
               "see the other replicas' errors above; if a replica was busy longer than that (a long evaluation or "
               "checkpoint on local replica 0), raise dist.local_timeout_s");
    // Back off: the first polls spin (a collective usually completes within microseconds of the
    // last rank's arrival), later ones sleep, up to 1 ms.
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 63))));
  }
}

void AbortableCalls::abort(const std::string& why, const std::function<void()>& release) {
  {
    std::lock_guard<std::mutex> l(why_mu_);
    if (why_.empty()) why_ = why.empty() ? "a local replica failed" : why;
  }
  aborted_.store(true, std::memory_order_release);  // no step starts from here on
  std::unique_lock<std::shared_mutex> l(mu_);      // waits only for a step already under way
  if (released_) return;
  released_ = true;
  release();
}

}  // namespace syncopate
