#include "common/stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>

namespace syncopate {
namespace {

std::atomic<bool> requested{false};
std::atomic<double> grace{60.0};
std::atomic<bool> installed{false};
// A launcher's trap and Slurm (or a process-group kill) often deliver the same notice twice within
// milliseconds: a second SIGTERM this soon after the first is the same notice, not "now".
constexpr double kSameNoticeS = 2.0;

// A thread that escaped the mask (started before it was set) may still take the signal: it only
// raises the flag, and the waiting thread never sees that one (no watchdog then, as before).
extern "C" void on_sigterm(int) { requested.store(true); }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Takes SIGTERM synchronously for the whole process: the first raises the flag, then the grace
// period runs; a second (after kSameNoticeS) or the end of the grace period exits at once.
void wait_for_signals(sigset_t set) {
  int sig = 0;
  if (sigwait(&set, &sig) != 0) return;
  requested.store(true);
  const auto first = std::chrono::steady_clock::now();
  const timespec tick{0, 100 * 1000 * 1000};
  for (;;) {
    if (sigtimedwait(&set, nullptr, &tick) == SIGTERM && seconds_since(first) >= kSameNoticeS) _exit(143);
    if (seconds_since(first) >= grace.load()) _exit(143);
  }
}

}  // namespace

void install_stop_signal(double grace_s) {
  grace = grace_s;
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  // Blocked in this thread, so in every thread it starts from now on (ZeroMQ's, LibTorch's, the
  // replicas'): no blocking call anywhere is interrupted (EINTR); one thread takes the signal.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(wait_for_signals, set).detach();
}

bool stop_requested() { return requested.load(); }

}  // namespace syncopate
