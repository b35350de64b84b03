#include "worker/sync/dist_config.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "common/atomic_file.h"
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

// The rendezvous port node 0 wrote to `file`, once it is there (waits up to timeout_s).
uint16_t wait_for_published_port(const std::string& file, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::ifstream f(file);
    long port = 0;
    if (f >> port) {
      SYN_CHECK(port >= 1 && port <= 65535, fmt::format("'{}' holds {}, not a TCP port", file, port),
                "remove the file (left by another job?) and start the job again");
      return static_cast<uint16_t>(port);
    }
    SYN_CHECK(std::chrono::steady_clock::now() < deadline,
              fmt::format("node 0 (or syncopate-rendezvous) did not publish its rendezvous port in '{}' within {} s", file,
                          timeout_s),
              "start node 0 (elastic ring: syncopate-rendezvous --port-file) with the same file (a path every node can "
              "read), or raise dist.timeout_s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Processes the launcher started on this host: torchrun's LOCAL_WORLD_SIZE, else Slurm's tasks per
// node ("8", "8(x2)" or "8,4(x3)": this host's is not known, the first is taken), else tasks / nodes.
int64_t processes_on_this_host() {
  if (env("LOCAL_WORLD_SIZE")) return env_int("LOCAL_WORLD_SIZE");
  if (const char* v = env("SLURM_NTASKS_PER_NODE")) {
    std::cmatch m;
    if (std::regex_search(v, m, std::regex(R"(^(\d+))"))) return std::stoll(m[1].str());
  }
  if (env("SLURM_NTASKS") && env("SLURM_NNODES") && env_int("SLURM_NNODES") > 0)
    return (env_int("SLURM_NTASKS") + env_int("SLURM_NNODES") - 1) / env_int("SLURM_NNODES");
  return 1;
}

// dist.launch: one process per node (it drives the node's GPUs) or one per GPU (it is a node of
// the job with one replica on the GPU of its local rank).
void resolve_launch_layout(DistConfig& c) {
  const int64_t here = processes_on_this_host();
  if (c.launch == "auto") c.launch = here > 1 ? "gpu" : "node";
  if (c.launch == "node") {
    SYN_CHECK(here <= 1,
              fmt::format("the launcher started {} processes on this host (LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE), "
                          "but dist.launch=node makes every one of them drive all of the host's GPUs", here),
              "start one process per node (torchrun --nproc-per-node=1, srun --ntasks-per-node=1) or use "
              "--dist.launch=gpu (or auto) for one process per GPU");
    return;
  }
  SYN_CHECK(c.local_replicas <= 1,
            fmt::format("dist.launch=gpu with dist.local_replicas={}", c.local_replicas),
            "one process per GPU has one replica: drop dist.local_replicas, or use --dist.launch=node to drive "
            "several GPUs from one process");
  c.local_replicas = 1;
  if (c.device < 0) {
    const int64_t local = env("LOCAL_RANK") ? env_int("LOCAL_RANK") : env("SLURM_LOCALID") ? env_int("SLURM_LOCALID") : -1;
    SYN_CHECK(local >= 0, "dist.launch=gpu but neither LOCAL_RANK (torchrun) nor SLURM_LOCALID (srun) is set",
              "start the processes with torchrun or srun, or give --dist.device=N");
    c.device = local;
  }
  if (env("LOCAL_WORLD_SIZE"))  // torchrun said how many processes share the host: the rank is one of them
    SYN_CHECK(c.device < here, fmt::format("local rank {} is outside the {} processes torchrun started on this host", c.device, here),
              "check LOCAL_RANK and LOCAL_WORLD_SIZE");
}

}  // namespace

std::string launch_layout_warning(const DistConfig& c) {
  const int64_t here = processes_on_this_host();
  if (c.launch != "gpu" || here <= 1) return "";
  return fmt::format(
      "one process per GPU with {} processes on this host: each GPU is a node of the job, so the host's GPUs "
      "exchange gradients over the inter-node {} (TCP through host memory), not NCCL over NVLink; a debugging "
      "layout. For training start one process per host (torchrun --nproc-per-node=1, srun --ntasks-per-node=1): "
      "it drives every local GPU as a replica, NCCL inside the host",
      here, c.mode == "ps" ? "parameter-server pushes" : "ring");
}

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
  auto first_of = [](std::initializer_list<const char*> names, int64_t fallback) {
    for (const char* n : names)
      if (env(n)) return env_int(n);
    return fallback;
  };
  if (c.nnodes == 0) c.nnodes = first_of({"NNODES", "WORLD_SIZE", "SLURM_NTASKS"}, 1);
  if (c.node_rank < 0) c.node_rank = first_of({"NODE_RANK", "RANK", "SLURM_PROCID"}, 0);
  resolve_launch_layout(c);
  // An elastic ring's NNODES is the nodes it starts with: a node joining later takes a rank of its own past them.
  const bool joins_later = c.elastic && c.mode == "ring";
  SYN_CHECK(c.nnodes >= 1 && c.node_rank >= 0 && (c.node_rank < c.nnodes || joins_later),
            fmt::format("node rank {} is outside 0..{} (nnodes {})", c.node_rank, c.nnodes - 1, c.nnodes),
            "set NODE_RANK (or --dist.node_rank) below NNODES on every node");
  SYN_CHECK(c.master_port == -1 || (c.master_port >= 1 && c.master_port <= 65535),
            fmt::format("MASTER_PORT {} is not a TCP port", c.master_port), "use a port between 1024 and 65535");
  SYN_CHECK(c.master_port != -1 || !c.rendezvous_file.empty(),
            "dist.master_port=-1 (any free port) needs dist.rendezvous_file, through which node 0 tells the others",
            "set --dist.rendezvous_file to a path every node can read, or give a fixed port");
}

std::vector<ResolvedField> explain_resolution(const DistConfig& c) {
  DistConfig r = c;
  resolve_from_environment(r);
  if (c.mode == "none")
    return {{"nnodes", "1", "dist.mode=none (one node)"}, {"node_rank", "0", "dist.mode=none (one node)"}};
  auto from_env = [](std::initializer_list<const char*> names) -> std::string {
    for (const char* n : names)
      if (env(n)) return std::string("$") + n;
    return "the default";
  };
  std::string addr_src = !c.master_addr.empty() ? "dist.master_addr"
                         : env("MASTER_ADDR")     ? "$MASTER_ADDR"
                         : env("SLURM_JOB_NODELIST") ? "the first host of $SLURM_JOB_NODELIST"
                                                     : "the default";
  return {{"nnodes", std::to_string(r.nnodes), c.nnodes != 0 ? "dist.nnodes" : from_env({"NNODES", "WORLD_SIZE", "SLURM_NTASKS"})},
          {"node_rank", std::to_string(r.node_rank),
           c.node_rank >= 0 ? "dist.node_rank" : from_env({"NODE_RANK", "RANK", "SLURM_PROCID"})},
          {"master_addr", "\"" + r.master_addr + "\"", addr_src},
          {"master_port", std::to_string(r.master_port), c.master_port != 0 ? "dist.master_port" : from_env({"MASTER_PORT"})}};
}

std::pair<std::string, uint16_t> rendezvous_service_address(const DistConfig& c) {
  if (c.master_port != -1) return {c.master_addr, static_cast<uint16_t>(c.master_port)};
  SYN_CHECK(!c.rendezvous_file.empty(), "dist.master_port=-1 without dist.rendezvous_file",
            "give the file syncopate-rendezvous --port-file wrote, or the service's port");
  return {c.master_addr, wait_for_published_port(c.rendezvous_file, c.timeout_s)};
}

RendezvousOptions rendezvous_options(const DistConfig& c, const std::string& token, const std::string& fingerprint) {
  RendezvousOptions o;
  o.master_addr = c.master_addr;
  if (c.master_port == -1) {
    const std::string file = c.rendezvous_file;
    if (c.node_rank == 0) {  // any free port, published once listening
      o.master_port = 0;
      o.on_listening = [file](uint16_t port) { publish_file(file, std::to_string(port) + "\n"); };
    } else {
      o.master_port = wait_for_published_port(file, c.timeout_s);
    }
  } else {
    o.master_port = static_cast<uint16_t>(c.master_port);
  }
  o.nnodes = static_cast<int>(c.nnodes);
  o.node_rank = static_cast<int>(c.node_rank);
  o.token = token;
  o.fingerprint = fingerprint;
  o.timeout_s = c.timeout_s;
  o.streams = static_cast<int>(c.streams);
  return o;
}

}  // namespace syncopate
