// Live status of a parameter-server job (syncopate-server --status): asks every shard for STATS
// and reports, per worker, its clock, how far it is behind the fastest, its progress per second
// (between two polls), the staleness of its last update, whether it is alive and how long it has
// been silent; the slowest live worker is marked as the straggler. A shard that does not answer
// (dead, wrong token or encryption) gets a line of its own and the others are still shown. It
// speaks as no worker (no INIT, no heartbeat): asking changes nothing on the shards.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace syncopate {

struct StatusOptions {
  std::string token;             // the job token (SYNCOPATE_TOKEN)
  std::string encrypt = "auto";  // as the job's workers: "auto" = token-derived CURVE, "off" = plain TCP
  std::string curve_server_key;  // the servers' public key from a key file, if they use one
  double timeout_s = 3;          // longest wait for one shard's answer, seconds
};

// One poll of every shard: {"shards": [{"endpoint", "ok" (it answered), "waiting"? (no worker has
// joined it yet), "error"?, "stats"?}], "workers": [...],
// "straggler": worker id or -1}. previous: an earlier poll (its "workers"/"time_s"), for rates.
nlohmann::json poll_status(const std::vector<std::string>& endpoints, const StatusOptions& o,
                           const nlohmann::json& previous = nullptr);
// The poll as a table for a terminal.
std::string format_status(const nlohmann::json& poll);

}  // namespace syncopate
