#include "common/comm/ring_membership.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"

namespace syncopate {
namespace {
constexpr double kStatusEvery_s = 5;  // how often waiting nodes hear what they wait for
constexpr int kUnreachableStrikes = 2;  // reports that leave a node out of a ring of two
}  // namespace

nlohmann::json hello_message(const MemberHello& h) {
  return {{"op", "hello"},         {"node", h.node},
          {"host", h.host},        {"port", h.port},
          {"fingerprint", h.fingerprint}, {"nnodes", h.nnodes},
          {"min_nodes", h.min_nodes},     {"reform_wait_s", h.reform_wait_s},
          {"start_wait_s", h.start_wait_s}, {"streams", h.streams}};
}

MemberHello parse_hello(const nlohmann::json& m, int max_nodes) {
  SYN_CHECK(m.is_object() && m.value("op", "") == "hello", "no hello", "");
  MemberHello h;
  h.node = m.at("node").get<int>();
  h.host = m.at("host").get<std::string>();
  h.port = m.at("port").get<uint16_t>();
  h.fingerprint = m.at("fingerprint").get<std::string>();
  h.nnodes = m.at("nnodes").get<int>();
  h.min_nodes = m.at("min_nodes").get<int>();
  h.reform_wait_s = m.at("reform_wait_s").get<double>();
  h.start_wait_s = m.at("start_wait_s").get<double>();
  h.streams = m.at("streams").get<int>();
  SYN_CHECK(h.node >= 0 && h.nnodes >= 1 && h.nnodes <= max_nodes && h.min_nodes >= 1 && h.min_nodes <= max_nodes &&
                h.reform_wait_s > 0 && h.start_wait_s > 0 && h.streams >= 1 && h.streams <= 64,
            "a hello out of range", "");
  return h;
}

std::string RingMembership::hello(int session, const MemberHello& h, double now) {
  if (finished_) return "the job has finished (a node completed its last step): there is nothing to join";
  if (settings_) {
    const MemberHello& s = *settings_;
    if (h.fingerprint != s.fingerprint)
      return fmt::format("node {} runs another model/config than the job (fingerprint '{}' != '{}')", h.node,
                         h.fingerprint, s.fingerprint);
    if (h.min_nodes != s.min_nodes || h.reform_wait_s != s.reform_wait_s || h.streams != s.streams)
      return fmt::format("node {} has other membership settings than the job (dist.min_nodes {} vs {}, "
                         "dist.reform_wait_s {} vs {}, dist.streams {} vs {})",
                         h.node, h.min_nodes, s.min_nodes, h.reform_wait_s, s.reform_wait_s, h.streams, s.streams);
  }
  for (const auto& [id, s] : sessions_)
    if (s.hello.node == h.node)
      return fmt::format("node {} is already in the job (its session from {} is alive): give the new node another "
                         "NODE_RANK, or stop the old one first", h.node, s.hello.host);
  if (!settings_) settings_ = h;
  Session s;
  s.hello = h;
  s.last_heard = now;
  sessions_[session] = s;
  return "";
}

RingMembership::Outbox RingMembership::regroup(int session, int64_t step, double now, int unlinked) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return {};
  it->second.waiting = true;
  it->second.step = step;
  it->second.last_heard = now;
  Outbox out = unlinked >= 0 && unlinked != it->second.hello.node ? strike(session, unlinked) : Outbox{};
  for (auto& m : decide(now)) out.push_back(std::move(m));
  return out;
}

RingMembership::Outbox RingMembership::strike(int reporter_session, int node) {
  auto target = std::find_if(sessions_.begin(), sessions_.end(), [&](const auto& e) { return e.second.hello.node == node; });
  if (target == sessions_.end()) return {};  // gone already
  Session &t = target->second, &r = sessions_[reporter_session];
  t.unreached_by.insert(r.hello.node);
  r.could_not_reach.insert(node);
  if (t.unreached_by.size() >= 2)
    return leave_out(target->first, fmt::format("nodes {} could not connect to node {}'s ring listener at {}:{}",
                                                fmt::join(t.unreached_by, " and "), node, t.hello.host, t.hello.port));
  if (r.could_not_reach.size() >= 2)
    return leave_out(reporter_session, fmt::format("node {} could not connect to nodes {}: its connections out fail",
                                                   r.hello.node, fmt::join(r.could_not_reach, " and ")));
  if (epoch_nodes_.size() == 2 && ++t.pair_strikes >= kUnreachableStrikes)
    return leave_out(target->first, fmt::format("node {} could not connect to node {}'s ring listener at {}:{} in {} "
                                                "formations (a ring of two cannot tell which side is at fault)",
                                                r.hello.node, node, t.hello.host, t.hello.port, kUnreachableStrikes));
  return {};
}

RingMembership::Outbox RingMembership::leave_out(int session, const std::string& why) {
  Outbox out = {{session, {{"op", "error"}, {"error", why + ": it is left out of the ring"}}}};
  end_session(session);
  return out;
}

void RingMembership::end_session(int session) {
  remove(session);
  silent_.push_back(session);
}

RingMembership::Outbox RingMembership::leave(int session, double now) {
  remove(session);
  return decide(now);
}

void RingMembership::done(int session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || !member_nodes_.count(it->second.hello.node)) return;
  it->second.done = any_done_ = true;
  update_finished();
}

void RingMembership::update_finished() {
  if (!any_done_ || finished_) return;
  for (int id : live_members())
    if (!sessions_[id].done) return;
  finished_ = true;
}

RingMembership::Outbox RingMembership::closed(int session, double now) {
  remove(session);
  return decide(now);
}

void RingMembership::heard(int session, double now) {
  if (auto it = sessions_.find(session); it != sessions_.end()) it->second.last_heard = now;
}

RingMembership::Outbox RingMembership::tick(double now) {
  if (settings_) {
    std::vector<int> quiet;
    for (const auto& [id, s] : sessions_)
      if (now - s.last_heard > settings_->reform_wait_s) quiet.push_back(id);
    for (int id : quiet) end_session(id);
  }
  return decide(now);
}

std::vector<int> RingMembership::members() const { return {member_nodes_.begin(), member_nodes_.end()}; }

void RingMembership::remove(int session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  member_nodes_.erase(it->second.hello.node);
  sessions_.erase(it);
  update_finished();
}

std::vector<int> RingMembership::live_members() const {
  std::vector<int> out;
  for (const auto& [id, s] : sessions_)
    if (member_nodes_.count(s.hello.node)) out.push_back(id);
  return out;
}

RingMembership::Outbox RingMembership::decide(double now) {
  Outbox out;
  std::vector<int> waiting;
  for (const auto& [id, s] : sessions_)
    if (s.waiting) waiting.push_back(id);
  if (waiting.empty()) {
    collecting_since_ = member_asked_since_ = -1;
    return out;
  }
  if (finished_) {  // joiners after the end: nothing to join
    for (int id : waiting) {
      out.push_back({id, {{"op", "error"}, {"error", "the job has finished: there is nothing to join"}}});
      sessions_[id].waiting = false;
    }
    collecting_since_ = member_asked_since_ = -1;
    return out;
  }
  if (collecting_since_ < 0) collecting_since_ = now;
  const MemberHello& job = *settings_;
  const std::vector<int> members = live_members();
  // Members still stepping in the old ring agree to come at their next step boundary.
  for (int id : members) {
    Session& s = sessions_[id];
    if (!s.waiting && !s.told_pending) {
      out.push_back({id, {{"op", "pending"}}});
      s.told_pending = true;
    }
  }
  std::set<int> present;
  for (int id : waiting) present.insert(sessions_[id].hello.node);
  bool all_members = true, some_member = false;
  for (int id : members) {
    all_members = all_members && sessions_[id].waiting;
    some_member = some_member || sessions_[id].waiting;
  }
  // A re-formation's wait counts from the first *member's* request: a joiner may ask long before the
  // members reach their next step boundary (a long step, an evaluation), and timing the wait from it
  // would close an epoch on the first member that comes, leaving the others out.
  if (!some_member) member_asked_since_ = -1;
  else if (member_asked_since_ < 0) member_asked_since_ = now;
  const double waited = now - collecting_since_;
  bool ready;
  if (epoch_ == 0) {
    ready = static_cast<int>(present.size()) >= job.nnodes || waited >= job.start_wait_s;
  } else {
    // Past the wait, without the members that neither asked nor died; but never without every
    // member of the running ring while one of them is alive (joiners alone would split the job).
    ready = all_members || (some_member && now - member_asked_since_ >= job.reform_wait_s) ||
            (members.empty() && waited >= job.reform_wait_s);
  }
  if (ready && static_cast<int>(present.size()) >= std::max(1, job.min_nodes)) return close_epoch(now);
  if (last_status_ < 0 || now - last_status_ >= kStatusEvery_s || now < last_status_) {
    last_status_ = now;
    std::vector<int> missing;
    if (epoch_ == 0) {
      for (int r = 0; r < job.nnodes; ++r)
        if (!present.count(r)) missing.push_back(r);
    } else {
      for (int r : epoch_nodes_)
        if (!present.count(r)) missing.push_back(r);
    }
    const std::string why =
        ready ? fmt::format("{} node(s) present, below dist.min_nodes={}", present.size(), job.min_nodes)
        : epoch_ == 0 ? fmt::format("the job starts with {} node(s) (up to {} s)", job.nnodes, job.start_wait_s)
                      : fmt::format("the ring's members come at their next step boundary (up to {} s)", job.reform_wait_s);
    nlohmann::json status = {{"op", "waiting"}, {"present", std::vector<int>(present.begin(), present.end())},
                             {"missing", missing}, {"min_nodes", job.min_nodes}, {"why", why}};
    for (int id : waiting) out.push_back({id, status});
  }
  return out;
}

RingMembership::Outbox RingMembership::close_epoch(double now) {
  Outbox out;
  std::vector<std::pair<int, int>> chosen;  // (node, session), ring order
  for (const auto& [id, s] : sessions_)
    if (s.waiting) chosen.push_back({s.hello.node, id});
  std::sort(chosen.begin(), chosen.end());
  int root = -1;
  int64_t best = -1;
  for (const auto& [node, id] : chosen)
    if (sessions_[id].step > best) best = sessions_[id].step, root = node;
  // A node a member could not connect to gets another predecessor (see regroup's `unlinked`).
  const size_t n = chosen.size();
  if (n >= 3)
    for (size_t i = 0; i < n; ++i) {
      const Session& s = sessions_[chosen[i].second];
      if (!s.unreached_by.empty() && s.unreached_by.count(chosen[(i + n - 1) % n].first))
        std::swap(chosen[i], chosen[(i + 1) % n]);
    }
  collecting_since_ = -1;
  member_asked_since_ = -1;
  last_status_ = -1;
  if (root < 0) {
    for (const auto& [node, id] : chosen) {
      out.push_back({id, {{"op", "error"},
                          {"error", "no node of the new membership holds the job's state (every one lost it while a "
                                    "re-formation broke off)"}}});
      sessions_[id].waiting = false;
    }
    return out;
  }
  ++epoch_;
  member_nodes_.clear();
  epoch_nodes_.clear();
  nlohmann::json members = nlohmann::json::array();
  for (const auto& [node, id] : chosen) {
    const Session& s = sessions_[id];
    member_nodes_.insert(node);
    epoch_nodes_.insert(node);
    members.push_back({{"node", node}, {"host", s.hello.host}, {"port", s.hello.port}, {"step", s.step}});
  }
  const nlohmann::json reply = {{"op", "epoch"}, {"epoch", epoch_}, {"members", members}, {"root", root}};
  for (const auto& [node, id] : chosen) {
    out.push_back({id, reply});
    sessions_[id].waiting = false;
  }
  for (auto& [id, s] : sessions_) s.told_pending = false;
  (void)now;
  return out;
}

}  // namespace syncopate
