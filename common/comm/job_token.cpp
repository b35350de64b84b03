#include "common/comm/job_token.h"

#include <cstdlib>

#include "common/atomic_file.h"
#include "common/log.h"

namespace syncopate {
namespace {
const char* const kInsecureDefault = "syncopate-insecure-default";
}  // namespace

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

std::string job_token_or_insecure_default(const std::string& who) {
  std::string t = job_token_from_environment();
  if (!t.empty()) return t;
  log::warn("{} warning: SYNCOPATE_TOKEN is not set; any local process can join this job", who);
  return kInsecureDefault;
}

bool is_insecure_default_token(const std::string& token) { return token.empty() || token == kInsecureDefault; }

}  // namespace syncopate
