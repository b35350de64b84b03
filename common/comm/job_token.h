// The shared secret that admits a process into a job (workers, servers, rendezvous).
#pragma once
#include <string>

namespace syncopate {

// $SYNCOPATE_TOKEN, or the contents of the file named by $SYNCOPATE_TOKEN_FILE; "" if neither.
std::string job_token_from_environment();

// job_token_from_environment(), or, when none is set, the one insecure default every process of
// an unconfigured job shares, with a warning (prefixed by `who`) that any local process can join.
std::string job_token_or_insecure_default(const std::string& who);
// Whether `token` is that insecure default (nothing derived from it protects anything).
bool is_insecure_default_token(const std::string& token);

}  // namespace syncopate
