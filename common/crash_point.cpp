#include "common/crash_point.h"

#include <csignal>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace syncopate {

void crash_point(const char* what, const char* phase, int64_t step) {
  static const std::string target = [] {
    const char* v = std::getenv("SYNCOPATE_CRASH_AT");
    return std::string(v ? v : "");
  }();
  if (target.empty() || target != fmt::format("{}:{}:{}", what, phase, step)) return;
  std::raise(SIGKILL);
}

bool fail_point(const char* what, const char* phase, int64_t step) {
  static const std::string target = [] {
    const char* v = std::getenv("SYNCOPATE_FAIL_AT");
    return std::string(v ? v : "");
  }();
  return !target.empty() && target == fmt::format("{}:{}:{}", what, phase, step);
}

}  // namespace syncopate
