// The abort protocol of a node's NCCL group (issue 28 (3)), driven on CPU: a fake communicator
// whose collective completes only once every local rank has issued it, as NCCL's lazy connection
// at the first collective of each kind does. A rank that never arrives (it failed while building)
// must not keep the others waiting, nor keep abort() out; an abort must never free the fake
// communicator while a call is using it; every wait is bounded.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "common/check.h"
#include "common/comm/abortable_calls.h"
#include "common/comm/abortable_barrier.h"
#include "tests/test_helpers.h"

using namespace syncopate;
using Progress = AbortableCalls::Progress;
using clock_type = std::chrono::steady_clock;

namespace {
// A communicator shared by n ranks: a collective issued by rank r is done once all n have issued
// it. Using it after release() (ncclCommAbort frees it) or during release() is recorded.
struct FakeComm {
  explicit FakeComm(int n) : n(n) {}
  const int n;
  std::atomic<int> arrived{0}, in_use{0}, used_after_release{0}, used_during_release{0}, releases{0};
  std::atomic<bool> released{false};
  Progress step(bool first) {
    ++in_use;
    if (released) ++used_after_release;
    if (first) ++arrived;
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // a call takes a little time
    const Progress p = arrived.load() >= n ? Progress::kDone : Progress::kPending;
    --in_use;
    return p;
  }
  void release() {
    if (in_use.load() != 0) ++used_during_release;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // freeing takes a while
    if (in_use.load() != 0) ++used_during_release;
    ++releases;
    released = true;
  }
};

// Runs f on its own thread and waits at most `s` seconds: a protocol that cannot be aborted makes
// this test fail (and the process exit, its threads being stuck for good) instead of hanging.
void within(double s, const std::string& what, std::function<void()> f) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> ready = done->get_future();
  std::thread([f = std::move(f), done] {
    f();
    done->set_value();
  }).detach();
  if (ready.wait_for(std::chrono::duration<double>(s)) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not return within " << s << " s";
    std::fflush(stdout);
    std::_Exit(1);
  }
}

using test::error_of;  // "" when f returned
}  // namespace

TEST(AbortableCalls, EveryRankArrivingCompletesTheCall) {
  FakeComm comm(3);
  AbortableCalls calls(30);
  std::vector<std::future<std::string>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(std::async(std::launch::async, [&] {
      return error_of([&] { calls.run("all-reduce", [&](bool first) { return comm.step(first); }); });
    }));
  for (auto& r : ranks) EXPECT_EQ(r.get(), "");
  EXPECT_EQ(comm.arrived.load(), 3);
  EXPECT_FALSE(calls.aborted());
}

// The hang: rank 2 fails before its first collective; ranks 0 and 1 wait in it. The
// failing rank's abort returns at once, the waiters fail with its reason, and the communicator
// is freed exactly once and never while a call uses it. (The previous protocol held the lock
// shared across the whole wait inside the call, so abort() never got the lock.)
TEST(AbortableCalls, AnAbortFromARankThatNeverArrivesReleasesTheWaitersAndReturns) {
  FakeComm comm(3);
  AbortableCalls calls(60);  // far longer than the test: only the abort can release them
  std::vector<std::future<std::string>> waiters;
  for (int r = 0; r < 2; ++r)
    waiters.push_back(std::async(std::launch::async, [&] {
      return error_of([&] { calls.run("all-reduce", [&](bool first) { return comm.step(first); }); });
    }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both are polling by now
  ASSERT_EQ(comm.arrived.load(), 2);
  within(2.0, "abort() from the rank that never arrived", [&] {
    calls.abort("local replica 2 failed: CUDA out of memory while building its model", [&] { comm.release(); });
  });
  for (auto& w : waiters) {
    within(5.0, "a waiting rank", [&] { w.wait(); });
    EXPECT_NE(w.get().find("local replica 2 failed: CUDA out of memory"), std::string::npos);
  }
  EXPECT_EQ(comm.releases.load(), 1);
  EXPECT_EQ(comm.used_during_release.load(), 0);
  EXPECT_EQ(comm.used_after_release.load(), 0);
  // A later call fails at once with the first reason, without touching the freed communicator;
  // a second abort does not free it again.
  EXPECT_NE(error_of([&] { calls.run("all-gather", [&](bool first) { return comm.step(first); }); })
                .find("CUDA out of memory"),
            std::string::npos);
  calls.abort("another reason", [&] { comm.release(); });
  EXPECT_EQ(comm.releases.load(), 1);
  EXPECT_EQ(comm.used_after_release.load(), 0);
  EXPECT_NE(calls.reason().find("CUDA out of memory"), std::string::npos);
}

// Many aborts racing many polling calls: the communicator is never used while or after it is
// freed (run 50 times: the race windows are small).
TEST(AbortableCalls, AbortRacingPollsNeverFreesACommunicatorInUse) {
  for (int round = 0; round < 50; ++round) {
    FakeComm comm(5);
    AbortableCalls calls(60);
    std::vector<std::future<std::string>> waiters;
    for (int r = 0; r < 4; ++r)
      waiters.push_back(std::async(std::launch::async, [&] {
        return error_of([&] { calls.run("all-reduce", [&](bool first) { return comm.step(first); }); });
      }));
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
    std::vector<std::future<void>> aborts;
    for (int a = 0; a < 2; ++a)
      aborts.push_back(std::async(std::launch::async, [&, a] { calls.abort("abort " + std::to_string(a), [&] { comm.release(); }); }));
    for (auto& a : aborts) within(5.0, "an abort", [&] { a.wait(); });
    for (auto& w : waiters) {
      within(5.0, "a waiting rank", [&] { w.wait(); });
      EXPECT_NE(w.get().find("local collective aborted: abort "), std::string::npos);
    }
    ASSERT_EQ(comm.releases.load(), 1);
    ASSERT_EQ(comm.used_during_release.load(), 0) << "round " << round;
    ASSERT_EQ(comm.used_after_release.load(), 0) << "round " << round;
  }
}

// Nobody aborts and a rank never comes (it hangs without failing): the wait ends at the bound,
// naming what it waited for and the setting that sets the bound.
TEST(AbortableCalls, AWaitThatNeverCompletesFailsAtItsBoundNamingIt) {
  FakeComm comm(2);
  AbortableCalls calls(0.3);
  const auto t0 = clock_type::now();
  const std::string e = error_of([&] { calls.run("reduce-scatter of local rank 0", [&](bool first) { return comm.step(first); }); });
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_NE(e.find("reduce-scatter of local rank 0 still pending after 0.3 s"), std::string::npos) << e;
  EXPECT_NE(e.find("dist.local_timeout_s"), std::string::npos) << e;
  EXPECT_GE(s, 0.3);
  EXPECT_LT(s, 3.0);
}

// The thread group's barrier is bounded the same way.
TEST(AbortableBarrier, ALateReplicaFailsTheWaitAtItsBound) {
  AbortableBarrier b(3, 0.3);
  auto one = std::async(std::launch::async, [&] { return error_of([&] { b.arrive_and_wait(); }); });
  const std::string e = one.get();
  EXPECT_NE(e.find("1 of 3 local replicas reached a collective within 0.3 s"), std::string::npos) << e;
  // The barrier is still usable by a full set afterwards (the timed-out arrival was withdrawn).
  std::vector<std::future<std::string>> all;
  for (int r = 0; r < 3; ++r) all.push_back(std::async(std::launch::async, [&] { return error_of([&] { b.arrive_and_wait(); }); }));
  for (auto& f : all) EXPECT_EQ(f.get(), "");
}
