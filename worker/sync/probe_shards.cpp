#include "worker/sync/probe_shards.h"

#include <exception>
#include <future>

#include <fmt/format.h>

#include "common/check.h"
#include "server/ps_config.h"
#include "server/ps_server.h"

namespace syncopate {

SpreadLayout spread_layout(const std::vector<std::optional<std::string>>& nodes,
                           const std::vector<std::optional<std::string>>& shards,
                           const std::vector<std::string>& endpoints, int rank) {
  SpreadLayout l;
  std::map<std::string, int> node_at;
  for (size_t r = 0; r < nodes.size() && l.why_not.empty(); ++r) {
    if (!nodes[r]) l.why_not = fmt::format("node {} recorded no address", r);
    else if (!node_at.emplace(*nodes[r], static_cast<int>(r)).second)
      l.why_not = fmt::format("nodes share the address {} (one host): which node's link a shard shares is unknown",
                              *nodes[r]);
  }
  for (size_t k = 0; k < shards.size() && l.why_not.empty(); ++k) {
    const auto host = shards[k] ? node_at.find(*shards[k]) : node_at.end();
    if (host == node_at.end())
      l.why_not = fmt::format("shard {} ({}) is not at a node's address: the probe starts its shards only on the "
                              "job's nodes", k, k < endpoints.size() ? endpoints[k] : std::string("?"));
    else if (host->second == rank)
      l.hosted.push_back(static_cast<int>(k));
  }
  if (!l.why_not.empty()) l.hosted.clear();
  return l;
}

ProbeShards::ProbeShards(const std::vector<int>& shards, const std::string& host, const std::string& token,
                         const std::string& encrypt, double latency_ms) {
  try {
    for (int k : shards) {
      ServerConfig sc;
      sc.host = host;
      sc.port = -1;  // any free port of this address
      sc.shard = k;
      sc.encrypt = encrypt;
      sc.threads = 1;
      sc.latency_ms = latency_ms;
      PsConfig pc;
      pc.consistency = "asp";
      auto listening = std::make_shared<std::promise<std::string>>();
      std::future<std::string> endpoint = listening->get_future();
      threads_.emplace_back([this, sc, pc, token, listening] {
        bool told = false;
        try {
          PsServer(sc, pc, token).run([&](const std::string& e) { told = true, listening->set_value(e); },
                                      [this] { return stop_.load(); });
          if (!told) listening->set_exception(std::make_exception_ptr(Error("it stopped before it listened")));
        } catch (...) {
          if (!told) listening->set_exception(std::current_exception());
        }
      });
      try {
        endpoints_[k] = endpoint.get();
      } catch (const std::exception& e) {
        SYN_FAIL(fmt::format("the probe's shard {} (ASP, for the spread rounds) could not listen on {}: {}", k, host, e.what()),
                 "check that this node's address is its own (MASTER_ADDR, the job's dist.servers)");
      }
    }
  } catch (...) {
    stop();
    throw;
  }
}

void ProbeShards::stop() {
  stop_ = true;
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

ProbeShards::~ProbeShards() { stop(); }

}  // namespace syncopate
