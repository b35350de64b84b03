#include "common/job_token.h"

#include <cstdlib>

#include "common/atomic_file.h"

namespace syncopate {

std::string job_token_from_environment() {
  const char* t = std::getenv("SYNCOPATE_TOKEN");
  if (t && *t) return t;
  const char* f = std::getenv("SYNCOPATE_TOKEN_FILE");
  if (f && *f) {
    std::string s = read_file(f);
    s.erase(s.find_last_not_of(" \n\r\t") + 1);
    return s;
  }
  return "";
}

}  // namespace syncopate
