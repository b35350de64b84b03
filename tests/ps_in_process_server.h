// A parameter server on a thread of the test's own process, over a real loopback socket (no
// mocked transport): for tests that drive it with real PsClients or hand-made requests.
#pragma once
#include <future>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "server/ps_client.h"
#include "server/ps_config.h"
#include "server/ps_keys.h"
#include "server/ps_server.h"

namespace syncopate::test {

// A PsServer on a thread of this process, on an ephemeral loopback port. Shut down (SHUTDOWN from
// a client of the job) and joined when the test ends, also when an assertion ends it early.
// client_key: the servers' public key when they use a key file.
class InProcessServer {
 public:
  InProcessServer(const ServerConfig& sc, const PsConfig& pc, const std::string& token, const std::string& client_key = "")
      : token_(token), key_(ps_client_server_key(token, sc.encrypt, client_key)) {
    std::promise<std::string> ep;
    auto f = ep.get_future();
    thread_ = std::thread([sc, pc, token, &ep] { PsServer(sc, pc, token).run([&ep](const std::string& e) { ep.set_value(e); }); });
    endpoint = f.get();  // the thread touches `ep` only before this returns
  }
  ~InProcessServer() {
    try {
      PsClientOptions o{10};
      o.curve_server_key = key_;
      PsClient({endpoint}, token_, 0, 1, o).shutdown_servers();
    } catch (...) {
    }
    thread_.join();
  }
  std::string endpoint;
  // A plain DEALER connected to it (servers with encrypt=off): to send hand-made requests.
  zmq::socket_t dealer(zmq::context_t& ctx) const {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::rcvtimeo, 5000);
    s.set(zmq::sockopt::linger, 0);
    s.connect(endpoint);
    return s;
  }

 private:
  std::string token_, key_;
  std::thread thread_;
};

}  // namespace syncopate::test
