// The shared secret that admits a process into a job (workers, servers, rendezvous).
#pragma once
#include <string>

namespace syncopate {

// $SYNCOPATE_TOKEN, or the contents of the file named by $SYNCOPATE_TOKEN_FILE; "" if neither.
std::string job_token_from_environment();

}  // namespace syncopate
