#include "common/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace syncopate::log {
namespace {

Level threshold() {
  static const Level t = [] {
    const char* v = std::getenv("SYNCOPATE_LOG");
    if (!v) return Level::kInfo;
    if (!std::strcmp(v, "debug")) return Level::kDebug;
    if (!std::strcmp(v, "warn")) return Level::kWarn;
    if (!std::strcmp(v, "error")) return Level::kError;
    return Level::kInfo;
  }();
  return t;
}

}  // namespace

bool enabled(Level level) { return level >= threshold(); }

void write(Level level, const std::string& line) {
  if (!enabled(level)) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> l(mu);
  std::FILE* f = level >= Level::kWarn ? stderr : stdout;
  std::fwrite(line.data(), 1, line.size(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

}  // namespace syncopate::log
