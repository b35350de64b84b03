// syncopate-probe: measures the cluster a job would run on, for the advisor (scripts/syncopate-advise).
// Started on every node like the worker, with the job's own config and launch environment
// (scripts/syncopate-probe, launch_node.sh's variables, torchrun, srun):
//   1. each node times real steps of the job's model, batch, accumulation and precision (paced by
//      emulate.* as training paces them: on an emulated cluster, the emulated step);
//   2. the nodes meet at the rendezvous (token, rank, the probe's settings) and form the ring;
//   3. every node times round trips and a bulk transfer on its link to the next node while answering
//      the previous node's (common/comm/link_probe.h), so every ring link is measured at once;
//   4. the job's exchange at the model's size, every node at once, rounds one base step apart
//      (worker/sync/exchange_probe.h): a ring all-reduce (probe.ring_rounds), and with dist.servers
//      (the job's shards, started under BSP) a push to the shards and their reply (probe.ps_rounds):
//      what the ring and BSP pay per step, burst, incast and TCP's losses included; and where every
//      shard is at a node's address (each node records its own), the same round trip to the probe's
//      own ASP shards in that layout (worker/sync/probe_shards.h) with the nodes' pushes spread over a
//      step (probe.spread_rounds): what an asynchronous mode pays per push, without BSP's incast;
//   5. node 0 gathers every node's record and writes probe.json (atomically) and a table.
// A node that never joins or dies: node 0 writes what it has, with "complete": false and "missing"
// naming each node and link it lacks and why, and exits 1.
//
//   syncopate-probe [--config FILE.toml] [--out probe.json] [--probe.field=value] [--section.field=value ...]
#include <unistd.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/command_line.h"
#include "common/comm/host_address.h"
#include "common/comm/job_token.h"
#include "common/comm/link_probe.h"
#include "common/comm/rendezvous.h"
#include "common/comm/transport/delayed_connection.h"
#include "common/config_schema.h"
#include "common/crash_point.h"
#include "common/log.h"
#include "model/gpt_config.h"
#include "server/ps_keys.h"
#include "worker/sync/dist_config.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/exchange_probe.h"
#include "worker/sync/probe_shards.h"
#include "worker/train/run_config.h"
#include "worker/train/step_probe.h"

using namespace syncopate;
using json = nlohmann::json;

namespace {

struct ProbeConfig {
  int64_t steps = 20;     // timed steps per node (their distribution: median, tails, jitter)
  int64_t warmup = 3;     // untimed steps first (allocation, caches, autotuning)
  int64_t pings = 30;     // round trips timed per ring link (the first 3 untimed)
  double seconds = 0.5;   // a link's bulk transfer doubles from 1 MiB until it takes at least this long, seconds
  double max_mb = 256;    // the largest bulk transfer, MiB (a fast link stops here)
  int64_t repeats = 3;    // transfers of the final size per link; the fastest is its goodput
  int64_t ring_rounds = 10; // timed ring all-reduces of the model's size (float32), every node at once, one base
                            // step apart (2 more untimed first); 0 = none
  int64_t ps_rounds = 10;   // with dist.servers: timed BSP round trips of the model's size to the servers, every
                            // node at once, one base step apart (2 more untimed first)
  int64_t spread_rounds = 10;  // with dist.servers all at the nodes' addresses: timed round trips of the model's size
                               // to the probe's own ASP shards in the job's layout, node r starting r/N of a base step
                               // after node 0, rounds one base step apart (2 more untimed first); 0 = none

  template <class V>
  void fields(V& v) {
    v("steps", steps, "timed steps per node", int64_t{1}, int64_t{100000});
    v("warmup", warmup, "untimed steps before them", int64_t{0}, int64_t{100000});
    v("pings", pings, "round trips timed per ring link (3 more untimed first)", int64_t{4}, int64_t{100000});
    v("seconds", seconds, "a link's bulk transfer grows until it takes this long, seconds", 0.001, 600.0);
    v("max_mb", max_mb, "the largest bulk transfer per link, MiB", 1.0, 65536.0);
    v("repeats", repeats, "transfers of the final size per link (the fastest is its goodput)", int64_t{1}, int64_t{100});
    v("ring_rounds", ring_rounds, "timed ring all-reduces of the model's size, every node at once (0 = none)", int64_t{0},
      int64_t{100000});
    v("ps_rounds", ps_rounds, "with dist.servers: timed parameter-server round trips of the model's size, every node "
      "at once", int64_t{1}, int64_t{100000});
    v("spread_rounds", spread_rounds, "with dist.servers on the job's nodes: timed round trips to the probe's own ASP "
      "shards, the nodes' pushes spread over a step (0 = none)", int64_t{0}, int64_t{100000});
  }
};

const char* kUsage =
    "usage: syncopate-probe [--config FILE.toml] [--out probe.json] [--probe.field=value] [--section.field=value ...]\n"
    "Measures the cluster for scripts/syncopate-advise: each node's step time for the job's model, batch and\n"
    "precision (paced by emulate.* as training is), the ring's links (round trips and goodput, all links at\n"
    "once), the ring's all-reduce and, with dist.servers (the job's shards started under BSP), their round trip\n"
    "at the model's size (every node at once), and memory headroom. Start it on every node as you start\n"
    "syncopate-worker (same config, same NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT/SYNCOPATE_TOKEN); node 0\n"
    "writes --out (default probe.json).\n"
    "dist.timeout_s must cover the slowest node's steps (the others wait for it at the rendezvous).\n"
    "Fields (current value, doc, allowed values):\n";

json summary(const std::vector<double>& v) {
  return {{"samples", v},          {"min", quantile(v, 0)},    {"p10", quantile(v, 0.1)}, {"median", quantile(v, 0.5)},
          {"p90", quantile(v, 0.9)}, {"max", quantile(v, 1)}, {"mean", [&] {
             double s = 0;
             for (double x : v) s += x;
             return v.empty() ? 0.0 : s / static_cast<double>(v.size());
           }()}};
}

double unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {0};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("unknown");
}

std::string fmt_bytes(double b) {
  if (b < 0) return "-";
  return b >= 1e9 ? fmt::format("{:.1f} GB", b / 1e9) : b >= 1e7 ? fmt::format("{:.0f} MB", b / 1e6) : fmt::format("{:.2f} MB", b / 1e6);
}

void print_table(const json& p) {
  std::cout << fmt::format("probe: {} node(s), {} parameters, {} tokens per node-step, {}{}\n", p["job"]["nodes"].get<int64_t>(),
                           p["job"]["params"].get<int64_t>(), p["job"]["tokens_per_node_step"].get<int64_t>(),
                           p["job"]["device"].get<std::string>(), p["complete"].get<bool>() ? "" : " (INCOMPLETE)");
  std::cout << fmt::format("{:>5} {:>14} {:>10} {:>21} {:>11} {:>9} {:>10} {:>10}\n", "node", "host", "step s",
                           "p10 .. p90", "compute s", "overruns", "peak RSS", "available");
  for (const auto& n : p["nodes"])
    std::cout << fmt::format("{:>5} {:>14} {:>10.4f} {:>10.4f} .. {:<8.4f} {:>11.4f} {:>9} {:>10} {:>10}\n",
                             n["node"].get<int64_t>(), n["host"].get<std::string>().substr(0, 14),
                             n["step_s"]["median"].get<double>(), n["step_s"]["p10"].get<double>(),
                             n["step_s"]["p90"].get<double>(), n["compute_s"]["median"].get<double>(),
                             n["overruns"].get<int64_t>(), fmt_bytes(n["memory"]["rss_peak_bytes"].get<double>()),
                             fmt_bytes(n["memory"]["host_available_bytes"].get<double>()));
  if (!p["links"].empty())
    std::cout << fmt::format("{:>8} {:>14} {:>21} {:>14} {:>12}\n", "link", "rtt us", "p10 .. p90", "goodput Gbit/s",
                             "transfer");
  for (const auto& l : p["links"])
    std::cout << fmt::format("{:>8} {:>14.1f} {:>10.1f} .. {:<8.1f} {:>14.4g} {:>12}\n",
                             fmt::format("{}->{}", l["from"].get<int64_t>(), l["to"].get<int64_t>()),
                             l["rtt_us"]["median"].get<double>(), l["rtt_us"]["p10"].get<double>(),
                             l["rtt_us"]["p90"].get<double>(), l["goodput_gbit"].get<double>(),
                             fmt_bytes(l["bytes"].get<double>()));
  // Each node's exchange rounds: the ring's all-reduce, the parameter servers' round trip.
  for (const auto& [key, title, bytes, when] :
       {std::tuple{"ring_exchange", std::string("ring all-reduce rounds"), "bytes_sent", "every node at once"},
        std::tuple{"ps", std::string("parameter-server round trips"), "bytes_pushed", "every node at once"},
        std::tuple{"ps_spread", std::string("parameter-server round trips to ASP shards"), "bytes_pushed",
                   "the nodes' pushes spread over a step"}}) {
    if (!p.contains(key) || !p[key].contains("nodes") || p[key]["nodes"].empty()) continue;
    const std::string what = p[key].contains("servers")
                                 ? fmt::format("{}, {} shard(s)", title, p[key]["servers"].get<int64_t>())
                                 : title;
    std::cout << fmt::format("{:>5} {:>14} {:>21} {:>12}   ({}, {})\n", "node", "round s", "p10 .. p90", "sent", what,
                             when);
    for (const auto& n : p[key]["nodes"])
      std::cout << fmt::format("{:>5} {:>14.4f} {:>10.4f} .. {:<8.4f} {:>12}\n", n["node"].get<int64_t>(),
                               n["round_s"]["median"].get<double>(), n["round_s"]["p10"].get<double>(),
                               n["round_s"]["p90"].get<double>(), fmt_bytes(n[bytes].get<double>()));
  }
  // Where each shard runs: a node's address (sharing its link), or a host of its own.
  if (p.contains("ps") && p["ps"].contains("endpoint_addresses"))
    for (size_t k = 0; k < p["ps"]["endpoints"].size(); ++k) {
      const json& a = p["ps"]["endpoint_addresses"][k];
      std::vector<int64_t> at;
      for (const auto& n : p["nodes"])
        if (!a.is_null() && n.value("address", json()) == a) at.push_back(n["node"].get<int64_t>());
      const std::string where = a.is_null()   ? "its host does not resolve here"
                                : at.empty()   ? "a host of its own (no node's address)"
                                : at.size() == 1 ? fmt::format("node {}'s address", at[0])
                                                 : fmt::format("the address of nodes {} (one host)", fmt::join(at, ", "));
      std::cout << fmt::format("shard {}: {} at {}\n", k, p["ps"]["endpoints"][k].get<std::string>(), where);
    }
  if (p.contains("ps_spread") && p["ps_spread"].contains("skipped"))
    std::cout << fmt::format("spread rounds to ASP shards not timed: {}\n", p["ps_spread"]["skipped"].get<std::string>());
  for (const auto& m : p["missing"])
    std::cout << fmt::format("missing: {}: {}\n", m["what"].get<std::string>(), m["why"].get<std::string>());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  RunConfig cfg;
  ProbeConfig probe;
  ConfigSchema schema;
  cfg.bind(schema);
  schema.section("probe", probe);
  schema.foreign_section("ps", "syncopate-server");
  schema.foreign_section("server", "syncopate-server");
  std::string out = "probe.json";
  DistConfig d;
  try {
    const std::vector<std::string> rest = apply_command_line(schema, args);
    for (size_t i = 0; i < rest.size(); ++i) {
      if (rest[i] == "--help" || rest[i] == "-h") {
        std::cout << kUsage << schema.help();
        return 0;
      } else if (flag_value(rest, i, "--out", out)) {
        SYN_CHECK(!out.empty(), "--out needs a file", "write --out probe.json");
      } else {
        SYN_FAIL(fmt::format("unknown argument '{}'", rest[i]), "see syncopate-probe --help");
      }
    }
    validate(cfg.model);
    cfg.emulate.validate();
    SYN_CHECK(cfg.emulate.latency_ms / 1e3 < cfg.dist.timeout_s / 2,
              fmt::format("emulate.latency_ms={} is not below half of dist.timeout_s={} s", cfg.emulate.latency_ms,
                          cfg.dist.timeout_s),
              "lower emulate.latency_ms or raise dist.timeout_s");
    d = cfg.dist;
    d.mode = "ring";  // whatever the job's mode: the probe measures the nodes and the links between them
    resolve_from_environment(d);
  } catch (const Error& e) {
    std::cerr << "syncopate-probe: config error: " << e.what() << "\n";
    return 2;
  }
  const int rank = static_cast<int>(d.node_rank), world = static_cast<int>(d.nnodes);
  json doc = {{"format", "syncopate-probe/1"}, {"created_unix_s", unix_s()}, {"complete", true},
              {"missing", json::array()},       {"nodes", json::array()},     {"links", json::array()}};
  auto write = [&] {
    if (rank != 0) return;
    // Complete means every node's record and every ring link's, whatever the bookkeeping said.
    if (doc["nodes"].size() != static_cast<size_t>(world) || doc["links"].size() != static_cast<size_t>(world > 1 ? world : 0) ||
        (doc.contains("ps") && doc["ps"]["nodes"].size() != static_cast<size_t>(world)) ||
        (doc.contains("ring_exchange") && doc["ring_exchange"]["nodes"].size() != static_cast<size_t>(world)) ||
        (doc.contains("ps_spread") && doc["ps_spread"].contains("nodes") &&
         doc["ps_spread"]["nodes"].size() != static_cast<size_t>(world)))
      doc["complete"] = false;
    write_file_atomic(out, doc.dump(1) + "\n");
    print_table(doc);
    std::cout << "probe: wrote " << out << "\n";
  };
  auto missing = [&](const std::string& what, const std::string& why) {
    doc["complete"] = false;
    doc["missing"].push_back({{"what", what}, {"why", why}});
  };
  try {
    // 1. This node's steps, on the device training would use (train.device, the launch layout).
    const bool cuda = cfg.train.device == "cuda" || (cfg.train.device == "auto" && torch::cuda::is_available());
    SYN_CHECK(!cuda || torch::cuda::is_available(), "train.device=cuda but CUDA is not available here",
              "probe with --train.device=cpu, or check the driver and CUDA_VISIBLE_DEVICES");
    const int device = cuda ? static_cast<int>(d.launch == "gpu" ? d.device : 0) : -1;
    if (rank == 0)
      log::info("[probe] {} node(s): timing {} step(s) of the model on each ({}), then the ring's links", world,
                probe.steps, device >= 0 ? "cuda" : "cpu");
    const StepProbeResult s = probe_steps(cfg, rank, device, static_cast<int>(probe.steps), static_cast<int>(probe.warmup));
    // Replicas of this node as training counts them: every visible GPU unless local_replicas says
    // otherwise (one per process with launch=gpu); one replica is timed (they run in parallel).
    const int64_t local = d.local_replicas > 0 ? d.local_replicas : (cuda && d.launch != "gpu" ? torch::cuda::device_count() : 1);
    doc["job"] = {{"nodes", world},
                  {"params", s.params},
                  {"preset", cfg.model.preset},
                  {"n_layer", cfg.model.n_layer},
                  {"n_embd", cfg.model.n_embd},
                  {"batch_size", cfg.train.batch_size},
                  {"grad_accum", cfg.train.grad_accum},
                  {"block_size", cfg.model.block_size},
                  {"local_replicas", local},
                  {"replicas_timed", 1},
                  {"tokens_per_node_step", s.tokens_per_step * local},
                  {"precision", s.bf16 ? "bf16" : "fp32"},
                  {"device", s.device},
                  {"train_device", cfg.train.device},
                  {"wire_bytes", cfg.dist.wire == "f32" ? 4 : cfg.dist.wire == "int8" ? 1 : 2},
                  {"emulated_step_s", cfg.emulate.step_time_s},
                  {"emulated_latency_ms", cfg.emulate.latency_ms}};
    // The address the job's peers see this node at (node 0: MASTER_ADDR; the others: where they send
    // from to reach it, as the rendezvous sees them): the advisor finds which shards share a node's link.
    json address = nullptr;
    try {
      address = rank == 0 ? numeric_address(d.master_addr) : local_address_towards(d.master_addr);
    } catch (const Error& e) {
      log::warn("[probe] node {}: its address is not recorded: {}", rank, e.what());
    }
    const json mine = {{"node", rank},
                       {"host", host_name()},
                       {"address", address},
                       {"measured_unix_s", unix_s()},
                       {"step_s", summary(s.step_s)},
                       {"compute_s", summary(s.compute_s)},
                       {"overruns", s.overruns},
                       {"memory",
                        {{"host_available_bytes", s.host_available_bytes},
                         {"rss_peak_bytes", s.rss_peak_bytes},
                         {"device_free_bytes", s.device_free_bytes},
                         {"device_total_bytes", s.device_total_bytes}}}};
    if (s.overruns > 0)
      log::warn("[probe] node {}: {} of {} steps computed longer than emulate.step_time_s allows: the emulation did not "
                "hold (the probe's step times are the real ones there)", rank, s.overruns, probe.steps);
    if (world == 1) {
      doc["nodes"].push_back(mine);
      write();
      return 0;
    }
    // 2. The ring (the probe's settings are part of the fingerprint: every node runs the same probe).
    RendezvousOptions ro = rendezvous_options(
        d, job_token_or_insecure_default("[probe]"),
        fmt::format("probe {} {} {} {} {} rounds {} {} servers {}", cfg.model_fingerprint(), probe.pings, probe.seconds,
                    probe.max_mb, probe.repeats, probe.ring_rounds, probe.ps_rounds, cfg.dist.servers) +
            fmt::format(" spread {}", probe.spread_rounds));
    ro.latency_s = cfg.emulate.latency_ms / 1e3;
    Ring ring;
    try {
      ring = connect_ring(ro);
    } catch (const Error& e) {
      doc["nodes"].push_back(mine);
      missing("the ring", e.what());  // (names the nodes that never connected)
      missing(fmt::format("nodes 1..{}", world - 1), "no records and no links: the rendezvous did not complete");
      throw;
    }
    // An emulated latency holds what a node receives on both directions of a link (the ring wraps only
    // the links it receives on; the probe's echoes come back on the sending ones).
    if (ro.latency_s > 0) ring.next = std::make_unique<DelayedConnection>(std::move(ring.next), ro.latency_s, ro.timeout_s);
    // 3. Every node's step record, then every link at once.
    try {
      const std::vector<std::string> records = ring_all_gather(rank, world, *ring.next, *ring.prev, mine.dump());
      for (const auto& r : records) doc["nodes"].push_back(json::parse(r));
    } catch (const std::exception& e) {
      doc["nodes"] = json::array({mine});
      for (int r = 1; r < world; ++r) missing(fmt::format("node {}", r), std::string("its record was not gathered: ") + e.what());
      throw;
    }
    crash_point("probe", "links", rank);  // (SYNCOPATE_CRASH_AT=probe:links:<node>: a node that dies here, for tests)
    LinkProbeOptions lo;
    lo.pings = static_cast<int>(probe.pings);
    lo.seconds = probe.seconds;
    lo.max_bytes = static_cast<size_t>(probe.max_mb * (1 << 20));
    lo.repeats = static_cast<int>(probe.repeats);
    lo.min_bytes = std::min(lo.min_bytes, lo.max_bytes);
    json link;
    try {
      const LinkProbe l = probe_link(*ring.next, *ring.prev, lo);
      link = {{"from", rank},          {"to", (rank + 1) % world}, {"rtt_us", summary(l.rtt_us)},
              {"goodput_gbit", l.goodput_gbit}, {"bytes", l.bytes}, {"seconds", l.seconds},
              {"repeats_gbit", l.repeats_gbit},
              {"measured_unix_s", unix_s()}};
      for (const auto& r : ring_all_gather(rank, world, *ring.next, *ring.prev, link.dump()))
        doc["links"].push_back(json::parse(r));
    } catch (const std::exception& e) {
      if (!link.is_null()) doc["links"].push_back(link);  // this node's own link was measured
      for (int r = 0; r < world; ++r)
        if (link.is_null() || r != rank)
          missing(fmt::format("link {}->{}", r, (r + 1) % world),
                  r == rank ? e.what() : fmt::format("not gathered: node {} lost the ring ({})", rank, e.what()));
      throw;
    }
    // 4. The job's exchange at the model's size, every node at once, rounds a base step apart (the
    // median over nodes of each one's fastest step, as the advisor's calibration takes it; the same on
    // every node): the ring's all-reduce, and with dist.servers the parameter servers' BSP round trip.
    std::vector<double> mins;
    for (const auto& n : doc["nodes"]) mins.push_back(n["step_s"]["min"].get<double>());
    const double gap = quantile(mins, 0.5);
    // Each node's rounds under doc[key]["nodes"], gathered over the ring; what failed is named under `what`.
    auto exchange = [&](const std::string& key, const std::string& what, json section,
                        const std::function<json()>& measure) {
      section["gap_s"] = gap;
      section["nodes"] = json::array();
      doc[key] = section;
      json mine_rounds;
      try {
        mine_rounds = measure();
        mine_rounds["node"] = rank;
        mine_rounds["measured_unix_s"] = unix_s();
        for (const auto& g : ring_all_gather(rank, world, *ring.next, *ring.prev, mine_rounds.dump()))
          doc[key]["nodes"].push_back(json::parse(g));
      } catch (const std::exception& e) {
        if (!mine_rounds.is_null()) doc[key]["nodes"].push_back(mine_rounds);
        missing(what, e.what());
        throw;
      }
    };
    if (probe.ring_rounds > 0)
      exchange("ring_exchange", "the ring all-reduce rounds", {{"rounds", probe.ring_rounds}}, [&] {
        const WireFormat wire = parse_wire_format(d.wire);  // the ring carries no int8: float32 there
        const ExchangeProbe r = probe_ring_rounds(rank, world, *ring.next, *ring.prev, s.params,
                                                  static_cast<int>(probe.ring_rounds), 2, gap,
                                                  wire == WireFormat::kInt8 ? WireFormat::kF32 : wire);
        return json{{"round_s", summary(r.round_s)}, {"bytes_sent", r.bytes_sent}, {"bytes_received", r.bytes_received}};
      });
    if (!cfg.dist.servers.empty()) {
      const std::vector<std::string> endpoints = PsClient::parse_endpoints(cfg.dist.servers);
      // Each shard's numeric address (null where its host does not resolve here), held against the nodes'.
      std::vector<std::optional<std::string>> shard_addresses;
      json addresses = json::array();
      for (const auto& e : endpoints) {
        try {
          shard_addresses.push_back(numeric_address(endpoint_host(e)));
        } catch (const Error&) {
          shard_addresses.push_back(std::nullopt);
        }
        addresses.push_back(shard_addresses.back() ? json(*shard_addresses.back()) : json(nullptr));
      }
      exchange("ps", "the parameter-server round trips",
               {{"servers", endpoints.size()}, {"endpoints", endpoints}, {"endpoint_addresses", addresses},
                {"rounds", probe.ps_rounds}}, [&] {
                 // The job's connection options, not its membership: the probe is no member of a training job
                 // (its digest is never taken for a training job's shards).
                 const PsClientOptions o = ps_connection_options(d, ro.token, "probe " + cfg.model_fingerprint());
                 const ExchangeProbe r = probe_ps_rounds(endpoints, ro.token, rank, world, o, s.params,
                                                         static_cast<int>(probe.ps_rounds), 2, gap);
                 return json{{"round_s", summary(r.round_s)}, {"parts", r.parts}, {"bytes_pushed", r.bytes_sent},
                             {"bytes_received", r.bytes_received}};
               });
      // The same round trips with the pushes spread out, as an asynchronous job's arrive: to the probe's
      // own ASP shards, each run by the node at the job's shard's address (so on that node's link). Only
      // where that node is unambiguous: every node at an address of its own, every shard at one of them.
      std::vector<std::optional<std::string>> node_addresses(world);
      for (const auto& n : doc["nodes"])
        if (const json a = n.value("address", json()); a.is_string())
          node_addresses.at(n["node"].get<size_t>()) = a.get<std::string>();
      const auto [hosted, why_not] = spread_layout(node_addresses, shard_addresses, endpoints, rank);
      if (probe.spread_rounds > 0 && !why_not.empty()) {
        doc["ps_spread"] = {{"skipped", why_not}};
      } else if (probe.spread_rounds > 0) {
        const std::string enc = d.ps_encrypt == "off" ? "off" : "auto";
        ProbeShards shards(hosted, address.get<std::string>(), ro.token, enc, cfg.emulate.latency_ms);
        std::vector<std::string> spread(endpoints.size());
        json mine_eps = json::object();
        for (const auto& [k, e] : shards.endpoints()) mine_eps[std::to_string(k)] = e;
        for (const auto& g : ring_all_gather(rank, world, *ring.next, *ring.prev, mine_eps.dump())) {
          const json theirs = json::parse(g);  // (named: items() of a temporary would dangle in the loop)
          for (const auto& [k, e] : theirs.items()) spread.at(std::stoul(k)) = e.get<std::string>();
        }
        exchange("ps_spread", "the parameter-server spread rounds",
                 {{"servers", spread.size()}, {"endpoints", spread}, {"rounds", probe.spread_rounds},
                  {"consistency", "asp"}, {"offset", "node r starts r/N of gap_s after node 0"}}, [&] {
                   PsClientOptions o = ps_connection_options(d, ro.token, "probe spread " + cfg.model_fingerprint());
                   o.curve_server_key = ps_client_server_key(ro.token, enc);
                   const ExchangeProbe r = probe_ps_spread_rounds(spread, ro.token, rank, world, o, s.params,
                                                                  static_cast<int>(probe.spread_rounds), 2, gap,
                                                                  gap * rank / world);
                   return json{{"round_s", summary(r.round_s)}, {"parts", r.parts}, {"bytes_pushed", r.bytes_sent},
                               {"bytes_received", r.bytes_received}};
                 });
      }  // (the shards stop here: every node's rounds were gathered, so every node is done with them)
    }
    write();
  } catch (const std::exception& e) {
    std::cerr << fmt::format("syncopate-probe: node {}: error: {}\n", rank, e.what());
    if (rank == 0 && doc.contains("job")) {
      if (doc["missing"].empty()) missing("the probe", e.what());
      try {
        write();
        std::cerr << "syncopate-probe: the result is partial: see \"missing\" in " << out << "\n";
      } catch (const std::exception& w) {
        std::cerr << "syncopate-probe: could not write " << out << ": " << w.what() << "\n";
      }
    }
    return 1;
  }
  return 0;
}
