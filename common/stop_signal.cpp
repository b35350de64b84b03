#include "common/stop_signal.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>
#include <unistd.h>

namespace syncopate {
namespace {

std::atomic<bool> requested{false};
std::atomic<bool> signalled{false};
std::atomic<double> grace{60.0};
std::atomic<bool> installed{false};

extern "C" void on_sigterm(int) {
  if (signalled.exchange(true)) _exit(143);  // the second: at once (async-signal-safe)
  requested.store(true);
}

}  // namespace

void install_stop_signal(double grace_s) {
  grace = grace_s;
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls go on; the loop looks at the flag between steps
  sigaction(SIGTERM, &sa, nullptr);
  // The grace watchdog: once a SIGTERM arrived, the process has grace_s to end by itself.
  std::thread([] {
    while (!signalled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace.load());
    while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    _exit(143);
  }).detach();
}

bool stop_requested() { return requested.load(); }

}  // namespace syncopate
