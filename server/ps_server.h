// The parameter-server process loop: a ZeroMQ ROUTER socket, one ParameterShard. Every message is
// validated; a bad one gets an ERROR reply and is counted, and the server carries on.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "server/ps_config.h"

namespace syncopate {

class PsServer {
 public:
  PsServer(const ServerConfig& server, const PsConfig& ps, const std::string& token);
  ~PsServer();
  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;
  // Binds tcp://host:port (port 0 -> ephemeral) and serves until SHUTDOWN, or until stop_requested
  // returns true (checked at least every 200 ms; syncopate-server sets it on SIGTERM/SIGINT).
  // `on_listening` gets the bound endpoint (also logged as "listening on tcp://HOST:PORT"). On
  // the way out it logs the shard's statistics as one line "[server K] stats {JSON}".
  void run(const std::function<void(const std::string&)>& on_listening = {},
           const std::function<bool()>& stop_requested = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace syncopate
