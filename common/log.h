// The one logger of the libraries: a line at a level, written whole (one mutex) to stdout (info)
// or stderr (warnings, errors), so that lines of concurrent threads and replicas never interleave.
// SYNCOPATE_LOG=warn (or error) silences the levels below it.
//
// Why not spdlog: Debian's spdlog 1.10 is built against fmt 9 and does not compile against the
// fmt 12 that LibTorch ships (and that every translation unit here must use, one fmt per
// program); this is the part of it the project needs, on that same fmt.
#pragma once
#include <string>
#include <utility>

#include <fmt/format.h>

namespace syncopate::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Writes one line (a newline is added) if `level` is enabled.
void write(Level level, const std::string& line);
bool enabled(Level level);

template <class... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::kInfo)) write(Level::kInfo, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  if (enabled(Level::kWarn)) write(Level::kWarn, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void error(fmt::format_string<A...> f, A&&... a) {
  write(Level::kError, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace syncopate::log
