// A node's side of the rendezvous service (an elastic ring's membership; common/comm/
// ring_membership.h has the rules): one authenticated TCP session for as long as the node runs,
// with heartbeats, the node's ring listener, and the epochs it asks for. Torch-free; Asio stays
// in the .cpp.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/ring_membership.h"

namespace boost::asio {
class io_context;
}

namespace syncopate {
class TcpListener;
struct JobKey;

struct EpochMember {
  int node = 0;
  std::string host;
  uint16_t port = 0;
  int64_t step = -1;  // where its state stood when it asked (-1: none): the owner's key (ElasticRing::reform)
};
// One closed epoch of the membership, as every member of it was told.
struct Epoch {
  int64_t number = 0;
  std::vector<EpochMember> members;  // ring order
  int root = 0;                      // node rank whose state every member takes
  int index = 0;                     // this node's position in `members`
  int root_index() const;
  std::string nodes() const;         // "0, 2, 3"
};

struct RendezvousSessionOptions {
  std::string addr = "127.0.0.1";  // the rendezvous service
  uint16_t port = 29500;
  std::string token;               // the job secret (challenge-response)
  MemberHello hello;               // host and port are filled in: this node's ring listener
  double timeout_s = 60;           // reaching the service, its answer to the hello
  double heartbeat_s = 1;          // proof of life, seconds (the service drops a session silent for reform_wait_s)
};

class RendezvousSession {
 public:
  // Connects, proves the token, says hello; throws syncopate::Error with the service's refusal by
  // name (another job's fingerprint, other membership settings, a node rank already live).
  explicit RendezvousSession(const RendezvousSessionOptions& o);
  ~RendezvousSession();  // ends the session (the service counts the node out if it was a member)
  RendezvousSession(const RendezvousSession&) = delete;
  RendezvousSession& operator=(const RendezvousSession&) = delete;

  // Asks for the next epoch with this node's state at `step` (-1: none); blocks until the
  // service closes it, logging what it waits for (the service's `waiting` statuses). Throws after
  // wait_limit_s, naming the missing nodes, or when the service refuses or is gone.
  // `unlinked` >= 0: the node this one could not connect to when the last epoch formed (the
  // service leaves a node out that its neighbours could not reach twice in a row).
  Epoch regroup(int64_t step, double wait_limit_s, int unlinked = -1);
  // The service asked the members to come at their next step boundary (a node waits to join).
  bool pending() const;
  void leave();  // preempted: out of the membership at once, then the session ends
  void done();   // the job's last step is done: no join is taken any more

  int node() const;
  boost::asio::io_context& io();
  TcpListener& listener();  // this node's ring listener (bound to the address that reaches the service)
  const JobKey& key() const;
  std::string where() const;  // "127.0.0.1:29500"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace syncopate
