// The rendezvous service of elastic rings (syncopate-rendezvous; the rules are
// common/comm/ring_membership.h): a TCP listener, one thread per node's session (challenge-response
// over the job token first, then JSON lines: hello, heartbeats, regroup, leave, done), and a timer
// thread for the waits. It outlives any node of the job, so the survivors of a failure re-form
// their ring through it without restarting. It holds no training state: a node's weights travel
// over the ring, from the epoch's root.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace syncopate {

struct RendezvousServiceOptions {
  std::string host = "127.0.0.1";  // the address the nodes reach it on (only that one is listened on)
  uint16_t port = 29500;           // 0: any free port (see on_listening)
  std::string token;               // the job secret: only nodes that prove it get a session
  std::function<void(uint16_t)> on_listening;  // called with the port once it listens
  // run() returns by itself once the job is over: a member finished its last step and no session
  // is left, or (when > 0) no session for this many seconds since the last one ended (every node
  // gone without finishing; not before the first session: nodes may take long to start). 0 / false:
  // only stop() ends it.
  bool exit_when_done = false;
  double idle_exit_s = 0;
  int max_connections = 256;  // connections still in their handshake at once; more are closed on arrival
};

class RendezvousService {
 public:
  explicit RendezvousService(const RendezvousServiceOptions& o);  // listens at once
  ~RendezvousService();  // stop(), then every session's thread joined
  uint16_t port() const;
  // Serves until stop() (from any thread or a signal handler's waiting thread).
  void run();
  void stop();
  int64_t epoch() const;  // the newest closed epoch (tests)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace syncopate
