#include "worker/sync/probe_shards.h"

#include <exception>
#include <future>

#include <fmt/format.h>

#include "common/check.h"
#include "server/ps_config.h"
#include "server/ps_server.h"

namespace syncopate {

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
