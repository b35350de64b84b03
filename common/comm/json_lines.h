// One JSON object per line over a Connection: the rendezvous' and the rendezvous service's
// messages. A line is at most 64 KiB, read within the connection's timeout, so a silent or
// flooding peer cannot stall its reader past it.
#pragma once
#include <nlohmann/json.hpp>

#include "common/comm/transport/connection.h"

namespace syncopate {

void write_json_line(Connection& c, const nlohmann::json& j);
// Throws syncopate::Error naming the peer on a malformed line (or what Connection::recv throws).
nlohmann::json read_json_line(Connection& c);

}  // namespace syncopate
