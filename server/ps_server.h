// The parameter-server process loop: a ZeroMQ ROUTER socket, one ParameterShard. Every message is
// validated; a bad one gets an ERROR reply and is counted, and the server carries on.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "server/ps_config.h"

namespace syncopate {

class PsServer {
 public:
  PsServer(const ServerConfig& server, const PsConfig& ps, const std::string& token);
  ~PsServer();
  // Binds tcp://host:port (port 0 -> ephemeral) and serves until SHUTDOWN. `on_listening` gets the
  // bound endpoint (also logged as "listening on tcp://HOST:PORT").
  void run(const std::function<void(const std::string&)>& on_listening = {});

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace syncopate
