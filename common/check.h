// Fail-fast error reporting: every error names where it was raised and what to do about it.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace syncopate {

// The one exception type Syncopate throws for user-facing problems (bad config, bad file, dead
// peer). what() reads "<problem> (hint: <what to do>) [file:line]".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const char* file, int line, const std::string& msg,
                              const std::string& hint = "") {
  std::string s = msg;
  if (!hint.empty()) s += " (hint: " + hint + ")";
  s += fmt::format(" [{}:{}]", file, line);
  throw Error(s);
}

}  // namespace syncopate

// SYN_FAIL(msg, hint): throw syncopate::Error with file and line.
#define SYN_FAIL(msg, hint) ::syncopate::fail(__FILE__, __LINE__, (msg), (hint))
// SYN_CHECK(cond, msg, hint): throw unless cond holds.
#define SYN_CHECK(cond, msg, hint)                   \
  do {                                               \
    if (!(cond)) SYN_FAIL((msg), (hint));            \
  } while (0)
