#include "common/comm/rendezvous_service.h"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/json_lines.h"
#include "common/comm/peer_auth.h"
#include "common/comm/ring_membership.h"
#include "common/comm/transport/tcp_connection.h"
#include "common/log.h"
#include "common/monotonic_clock.h"

namespace syncopate {
namespace {
double now_s() { return monotonic_seconds(); }
constexpr double kHandshake_s = 10;  // a connection that does not prove the token and say hello within this is dropped
constexpr int kMaxNodes = 1 << 16;   // a hello past this (nnodes, min_nodes) is dropped: no job is that large
}  // namespace

struct RendezvousService::Impl {
  RendezvousServiceOptions opt;
  asio::io_context io;
  std::unique_ptr<TcpListener> listener;
  JobKey key;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;  // the rules, the peers, the open connections, the threads, the log of epochs
  RingMembership rules;
  struct Peer {
    std::shared_ptr<TcpConnection> conn;
    std::shared_ptr<std::mutex> send_mu = std::make_shared<std::mutex>();
    int node = -1;
  };
  std::map<int, Peer> peers;  // by session
  std::map<int, std::shared_ptr<TcpConnection>> open;  // every session's connection, ended at stop()
  std::map<int, std::thread> threads;                   // every session's, joined once it ended (finished)
  std::vector<int> finished;
  std::thread timer;
  int next_session = 0;
  int64_t logged_epoch = 0;
  double last_session_end = -1;  // when the last session ended (-1: none has yet; the idle wait starts then)
  double last_refusal_log = -1;

  // The job is over (RendezvousServiceOptions::exit_when_done / idle_exit_s); under mu.
  bool job_over(double now) const {
    if (!peers.empty()) return false;
    if (opt.exit_when_done && rules.finished()) return true;
    return opt.idle_exit_s > 0 && last_session_end >= 0 && now - last_session_end >= opt.idle_exit_s;
  }

  // Sends what the rules want sent (under mu); a peer that cannot take it ends by its own thread.
  void deliver(const RingMembership::Outbox& out) {
    for (const auto& [id, msg] : out) {
      auto it = peers.find(id);
      if (it == peers.end()) continue;
      if (msg.value("op", "") == "epoch" && msg.at("epoch").get<int64_t>() > logged_epoch) {
        logged_epoch = msg.at("epoch").get<int64_t>();
        std::string nodes;
        for (const auto& m : msg.at("members"))
          nodes += fmt::format("{}{} (at {})", nodes.empty() ? "" : ", ", m.at("node").get<int>(), m.at("step").get<int64_t>());
        log::info("[rendezvous] epoch {}: the ring is node(s) {}; every member takes node {}'s state (the largest \"at\": "
                  "the step, or 2 x step + 1 if unapplied in local SGD)", logged_epoch, nodes,
                  msg.at("root").get<int>());
      }
      try {
        std::lock_guard<std::mutex> l(*it->second.send_mu);
        write_json_line(*it->second.conn, msg);
      } catch (const std::exception&) {
      }
    }
  }

  // A session's thread: nothing a peer sends or does (a reset before the first byte, garbage, a
  // line too long) gets past this function; it ends that session only.
  void serve(int id, asio::ip::tcp::socket socket) {
    try {
      serve_session(id, std::move(socket));
    } catch (const std::exception& e) {
      log::warn("[rendezvous] session {} ended: {}", id, e.what());
      std::lock_guard<std::mutex> l(mu);
      close_locked(id);
    }
  }
  // A session is over: out of the rules, its connection ended (under mu).
  void close_locked(int id) {
    deliver(rules.closed(id, now_s()));
    if (peers.erase(id)) last_session_end = now_s();
    end_locked(id);
  }
  // The sessions the rules put out (silent, or unreachable by their neighbours): their connections
  // end, and so do their threads (under mu).
  void end_silent_locked(const char* why) {
    for (int id : rules.take_silent())
      if (auto it = peers.find(id); it != peers.end()) {
        log::warn("[rendezvous] node {} {}: out of the membership", it->second.node, why);
        it->second.conn->shutdown();
      }
  }
  void serve_session(int id, asio::ip::tcp::socket socket) {
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);  // a peer that reset at once has none
    if (ec) {
      end(id);
      return;
    }
    const std::string from = remote.address().to_string();
    auto conn = std::make_shared<TcpConnection>(std::move(socket), "a node at " + from, kHandshake_s);
    {
      std::lock_guard<std::mutex> l(mu);
      open[id] = conn;
    }
    MemberHello h;
    try {
      const int node = authenticate_peer(*conn, key, 0, -1);  // another job's token, garbage, a scanner: dropped here
      h = parse_hello(read_json_line(*conn), kMaxNodes);
      SYN_CHECK(node == h.node, fmt::format("a hello for node {} from node {}", h.node, node), "");
    } catch (const std::exception& e) {
      log::warn("[rendezvous] dropped a connection from {}: {}", from, e.what());
      end(id);
      return;
    }
    auto session = std::make_shared<TcpConnection>(std::move(conn->socket()), fmt::format("node {} at {}", h.node, from), 1e6);
    {
      std::lock_guard<std::mutex> l(mu);
      open[id] = session;
      const std::string refused = rules.hello(id, h, now_s());
      if (!refused.empty()) {
        log::warn("[rendezvous] refused node {} from {}: {}", h.node, from, refused);
        try {
          write_json_line(*session, {{"op", "refused"}, {"error", refused}});
        } catch (const std::exception&) {
        }
        end_locked(id);
        return;
      }
      peers[id] = Peer{session, std::make_shared<std::mutex>(), h.node};
      write_json_line(*session, {{"op", "welcome"}, {"epoch", rules.epoch()}});
      log::info("[rendezvous] node {} ({}:{}) has a session", h.node, h.host, h.port);
    }
    std::string why = "its connection ended";
    try {
      for (;;) {
        const nlohmann::json m = read_json_line(*session);
        const std::string op = m.is_object() ? m.value("op", "") : "";
        std::lock_guard<std::mutex> l(mu);
        rules.heard(id, now_s());
        if (op == "regroup" && m.contains("step") && m.at("step").is_number_integer()) {
          const int unlinked = m.contains("unlinked") && m.at("unlinked").is_number_integer() ? m.at("unlinked").get<int>() : -1;
          deliver(rules.regroup(id, m.at("step").get<int64_t>(), now_s(), unlinked));
          end_silent_locked("cannot be reached by its ring neighbours");  // (told why first)
        } else if (op == "leave") {
          log::info("[rendezvous] node {} leaves the job", h.node);
          deliver(rules.leave(id, now_s()));
          why = "";
        } else if (op == "done") {
          rules.done(id);
        } else if (op != "hb") {
          log::warn("[rendezvous] node {} sent an unknown message: ignored", h.node);
        }
      }
    } catch (const std::exception& e) {
      if (!stop) why = e.what();
    }
    std::lock_guard<std::mutex> l(mu);
    if (!why.empty() && !stop && peers.count(id)) log::info("[rendezvous] node {}'s session ended: {}", h.node, why);
    close_locked(id);
  }
  // A session's thread is over: its connection closed, the thread joined by the accept loop.
  void end(int id) {
    std::lock_guard<std::mutex> l(mu);
    end_locked(id);
  }
  void end_locked(int id) {
    if (auto it = open.find(id); it != open.end()) {
      it->second->shutdown();
      open.erase(it);
    }
    finished.push_back(id);
  }
  void join_finished() {
    std::vector<std::thread> done;
    {
      std::lock_guard<std::mutex> l(mu);
      for (int id : std::exchange(finished, {}))
        if (auto it = threads.find(id); it != threads.end()) done.push_back(std::move(it->second)), threads.erase(it);
    }
    for (auto& t : done) t.join();
  }

  void timers() {
    while (!stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> l(mu);
      deliver(rules.tick(now_s()));
      end_silent_locked("went silent");
    }
  }
};

RendezvousService::RendezvousService(const RendezvousServiceOptions& o) : impl_(std::make_unique<Impl>()) {
  impl_->opt = o;
  impl_->key = job_key(o.token);
  impl_->listener = std::make_unique<TcpListener>(impl_->io, o.host, o.port);
  if (o.on_listening) o.on_listening(impl_->listener->port());
}

RendezvousService::~RendezvousService() {
  stop();
  auto& I = *impl_;
  std::map<int, std::thread> threads;
  {
    std::lock_guard<std::mutex> l(I.mu);
    for (auto& [id, c] : I.open) c->shutdown();
    threads = std::move(I.threads);
  }
  for (auto& [id, t] : threads)
    if (t.joinable()) t.join();
  if (I.timer.joinable()) I.timer.join();
}

uint16_t RendezvousService::port() const { return impl_->listener->port(); }
void RendezvousService::stop() { impl_->stop = true; }
int64_t RendezvousService::epoch() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->rules.epoch();
}

void RendezvousService::run() {
  auto& I = *impl_;
  I.timer = std::thread([&I] { I.timers(); });
  while (!I.stop) {
    I.join_finished();
    {
      std::lock_guard<std::mutex> l(I.mu);
      if (I.job_over(now_s())) {
        log::info("[rendezvous] the job is over ({}): stopping",
                  I.rules.finished() ? "its last step is done and every node's session ended" : "no node for a while");
        break;
      }
    }
    asio::ip::tcp::socket s(I.io);
    try {
      s = I.listener->accept(0.2, "a node");
    } catch (const Error&) {
      continue;  // nothing within 0.2 s: look at the stop flag again
    }
    const int id = I.next_session++;
    std::lock_guard<std::mutex> l(I.mu);
    // Connections still proving the token (sessions are not counted: a job may have many nodes).
    if (static_cast<int>(I.threads.size() - I.peers.size()) >= I.opt.max_connections) {  // a flood: closed on arrival
      if (now_s() - I.last_refusal_log > 10) {
        I.last_refusal_log = now_s();
        log::warn("[rendezvous] {} connections at once before their handshake: closing new ones until some end",
                  I.threads.size() - I.peers.size());
      }
      continue;
    }
    try {
      I.threads[id] = std::thread([&I, id, sock = std::move(s)]() mutable { I.serve(id, std::move(sock)); });
    } catch (const std::system_error& e) {  // no thread to be had: this connection is closed, the service goes on
      I.threads.erase(id);
      log::warn("[rendezvous] could not start a session thread ({}): connection closed", e.what());
    }
  }
  std::lock_guard<std::mutex> l(I.mu);
  for (auto& [id, c] : I.open) c->shutdown();
}

}  // namespace syncopate
