// The rules of an elastic ring's membership (dist.elastic with dist.mode=ring; issue 30), as the
// rendezvous service (common/comm/rendezvous_service.h) applies them: transport-free, every call
// given the time, every message it wants sent returned as (session, JSON) pairs.
//
// A node keeps one session with the service for as long as it runs: a hello (its node rank, its
// ring listener, the job's fingerprint and membership settings), heartbeats, and, whenever its ring
// must be formed or re-formed, a `regroup` request with the step its state stands at. The service
// answers every waiting node at once with the next *epoch*: the members (node rank order is ring
// order), each one's listener, and the *root*: the member whose state (weights, optimizer, the
// job's step, tokens and data position) every other member takes before the ring goes on — the
// one furthest along (largest step; lowest node rank among equals).
//
// An epoch closes when
//   - every member of the current epoch whose session is alive has asked, together with the nodes
//     waiting to join (a planned change: a join, a preemption, a failure every survivor saw); or
//   - reform_wait_s after the first request, with the nodes that asked (a member that neither asks
//     nor dies — hung — is left out; it comes back as a joiner);
//   - the first epoch: once nnodes nodes asked, or after start_wait_s with those that did;
// and never below min_nodes: until then every waiting node is told, every few seconds, which nodes
// it waits for. A node that asks while no change is under way (a joiner) makes the service tell
// every member `pending`: the members agree at their next step boundary (a flag in a collective of
// the ring) and all ask. A session that ends (a process killed: its socket closes) or stays silent
// for reform_wait_s is out of the membership at once.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace syncopate {

// What a node says of itself when its session starts (the hello's fields).
struct MemberHello {
  int node = 0;                 // the node's rank: its identity in the job (stable across epochs)
  std::string host;             // its ring listener
  uint16_t port = 0;
  std::string fingerprint;      // model + config digest: every node of the job alike
  int nnodes = 1;               // nodes the job starts with
  int min_nodes = 1;            // the fewest the ring may shrink to before it waits
  double reform_wait_s = 10;    // how long a re-formation waits for a member that neither asks nor dies
  double start_wait_s = 60;     // the first epoch: how long it waits for nnodes nodes before starting with fewer
  int streams = 1;              // TCP streams per ring link
};
// The hello as it travels (op "hello" and the fields above), both ways. parse_hello throws on a
// missing or mistyped field and on values no job has (ranks, counts, waits); `max_nodes` bounds
// nnodes and min_nodes.
nlohmann::json hello_message(const MemberHello& h);
MemberHello parse_hello(const nlohmann::json& m, int max_nodes);

class RingMembership {
 public:
  using Outbox = std::vector<std::pair<int, nlohmann::json>>;  // (session, message)

  // A session said hello: "" when admitted, else why it is refused (by name: another job's
  // fingerprint, other membership settings, a node rank already live, the job over).
  std::string hello(int session, const MemberHello& h, double now);
  // The node asks for the next epoch; `step`: where its state stands (-1: it holds none, e.g. a
  // re-formation broke off while it received the root's state).
  // `unlinked` >= 0: the node whose ring listener this one could not connect to when the last
  // epoch formed. The next epoch gives that node another predecessor (ring order otherwise follows
  // node ranks), so that a second report is independent evidence: a node two members could not
  // reach is left out (a firewall, a wrong address), and so is a member that could not reach two
  // others (its own outbound connections fail); in a ring of two, where nothing tells them apart, the
  // unreached node after a second report. It is told `error` and its session closed (take_silent).
  // Without this, the same membership would close and fail again and again.
  Outbox regroup(int session, int64_t step, double now, int unlinked = -1);
  // The node leaves on purpose (preempted): out of the membership at once.
  Outbox leave(int session, double now);
  // The node finished the job's last step. Once every live member of the epoch has (the others
  // closed), the job is over: no join is taken from here on. Until then a member that is still
  // asking (its last agreement failed) forms a ring with whoever asks, and takes the state furthest along.
  void done(int session);
  // The session ended (EOF, an error, silence): out at once.
  Outbox closed(int session, double now);
  // Proof of life (heartbeat); a session silent for reform_wait_s is closed by tick().
  void heard(int session, double now);
  // Timers: the waits above, silent sessions, the periodic `waiting` status.
  Outbox tick(double now);

  int64_t epoch() const { return epoch_; }
  bool finished() const { return finished_; }  // every live member completed the job's last step
  std::vector<int> members() const;  // node ranks of the current epoch
  // Sessions put out since the last call: silent (tick) or unreachable (regroup); the service ends their connections.
  std::vector<int> take_silent() { return std::exchange(silent_, {}); }

 private:
  struct Session {
    MemberHello hello;
    double last_heard = 0;
    bool waiting = false;
    int64_t step = -1;
    bool told_pending = false;
    std::set<int> unreached_by;    // members that could not connect to this node's listener
    std::set<int> could_not_reach; // members this node could not connect to
    int pair_strikes = 0;          // reports against it from a ring of two
    bool done = false;      // completed the job's last step
  };
  bool job_settings_known() const { return settings_.has_value(); }
  Outbox decide(double now);
  Outbox strike(int reporter_session, int node);
  Outbox leave_out(int session, const std::string& why);
  Outbox close_epoch(double now);
  void remove(int session);
  void end_session(int session);  // out, and its connection to be ended (take_silent)
  void update_finished();
  std::vector<int> live_members() const;  // sessions of current members

  std::map<int, Session> sessions_;       // live sessions (said hello, not closed)
  std::set<int> member_nodes_;            // node ranks of the current epoch still live
  std::set<int> epoch_nodes_;             // node ranks the current epoch closed with (the missing are named from it)
  std::optional<MemberHello> settings_;   // the first hello's job settings
  int64_t epoch_ = 0;                     // 0: no ring formed yet
  double collecting_since_ = -1;          // first outstanding request's time; -1: none
  double member_asked_since_ = -1;        // first request of a current member in this collection; -1: none
  double last_status_ = -1;               // last `waiting` status sent
  bool finished_ = false;                 // every live member finished the job
  bool any_done_ = false;                 // a member finished it
  std::vector<int> silent_;
};

}  // namespace syncopate
