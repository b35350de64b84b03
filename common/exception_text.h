// The message of an exception held in an exception_ptr (a failure carried across threads), for
// errors that report it where it is taken, not where it was thrown.
#pragma once
#include <exception>
#include <string>

namespace syncopate {

inline std::string exception_text(const std::exception_ptr& e) {
  if (!e) return "no error";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace syncopate
