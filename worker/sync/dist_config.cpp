#include "worker/sync/dist_config.h"

#include <cstdlib>
#include <regex>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t env_int(const char* name) {
  const char* v = env(name);
  try {
    size_t used = 0;
    int64_t x = std::stoll(v, &used);
    if (used == std::string(v).size()) return x;
  } catch (const std::exception&) {
  }
  SYN_FAIL(fmt::format("environment variable {}='{}' is not an integer", name, v), "export it as a plain number");
}

// First host of a Slurm node list such as "node[03-05,07],gpu1" -> "node03".
std::string first_slurm_host(const std::string& list) {
  std::smatch m;
  if (std::regex_search(list, m, std::regex(R"(^([^,\[]+)\[(\d+))"))) return m[1].str() + m[2].str();
  return list.substr(0, list.find(','));
}

}  // namespace

void resolve_from_environment(DistConfig& c) {
  if (c.mode == "none") {
    c.nnodes = 1;
    c.node_rank = 0;
    return;
  }
  if (c.master_addr.empty()) {
    if (env("MASTER_ADDR")) c.master_addr = env("MASTER_ADDR");
    else if (env("SLURM_JOB_NODELIST")) c.master_addr = first_slurm_host(env("SLURM_JOB_NODELIST"));
    else c.master_addr = "127.0.0.1";
  }
  if (c.master_port == 0) c.master_port = env("MASTER_PORT") ? env_int("MASTER_PORT") : 29500;
  if (c.nnodes == 0) c.nnodes = env("NNODES") ? env_int("NNODES") : env("SLURM_NTASKS") ? env_int("SLURM_NTASKS") : 1;
  if (c.node_rank < 0) c.node_rank = env("NODE_RANK") ? env_int("NODE_RANK") : env("SLURM_PROCID") ? env_int("SLURM_PROCID") : 0;
  SYN_CHECK(c.nnodes >= 1 && c.node_rank >= 0 && c.node_rank < c.nnodes,
            fmt::format("node rank {} is outside 0..{} (nnodes {})", c.node_rank, c.nnodes - 1, c.nnodes),
            "set NODE_RANK (or --dist.node_rank) below NNODES on every node");
  SYN_CHECK(c.master_port >= 1 && c.master_port <= 65535, fmt::format("MASTER_PORT {} is not a TCP port", c.master_port),
            "use a port between 1024 and 65535");
}

RendezvousOptions rendezvous_options(const DistConfig& c, const std::string& token, const std::string& fingerprint) {
  RendezvousOptions o;
  o.master_addr = c.master_addr;
  o.master_port = static_cast<uint16_t>(c.master_port);
  o.nnodes = static_cast<int>(c.nnodes);
  o.node_rank = static_cast<int>(c.node_rank);
  o.token = token;
  o.fingerprint = fingerprint;
  o.timeout_s = c.timeout_s;
  o.streams = static_cast<int>(c.streams);
  return o;
}

}  // namespace syncopate
