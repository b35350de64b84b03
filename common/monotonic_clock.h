// The monotonic clock in seconds, as the libraries measure waits, timeouts and modelled holds
// (steady_clock: never jumps with the system time). The worker's metrics use worker/metrics'
// now_seconds(), the same clock.
#pragma once
#include <chrono>
#include <thread>

namespace syncopate {

inline double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sleeps until monotonic_seconds() reaches t_s (at once if it has).
inline void sleep_until_seconds(double t_s) {
  if (const double left = t_s - monotonic_seconds(); left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
}

}  // namespace syncopate
