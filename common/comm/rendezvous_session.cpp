#include "common/comm/rendezvous_session.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/check.h"
#include "common/comm/json_lines.h"
#include "common/comm/peer_auth.h"
#include "common/comm/transport/tcp_connection.h"
#include "common/log.h"

namespace syncopate {

int Epoch::root_index() const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].node == root) return static_cast<int>(i);
  return 0;
}
std::string Epoch::nodes() const {
  std::vector<int> n;
  for (const auto& m : members) n.push_back(m.node);
  return fmt::format("{}", fmt::join(n, ", "));
}

struct RendezvousSession::Impl {
  RendezvousSessionOptions opt;
  asio::io_context io;
  JobKey key;
  std::unique_ptr<TcpConnection> conn;
  std::unique_ptr<TcpListener> listener;
  std::mutex send_mu;  // the heartbeat thread and the caller both send
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> pending{false};
  bool stop = false;
  bool ended = false;  // the session is over (the service closed it, or an error)
  std::string error;   // why, or the service's error
  std::optional<Epoch> epoch;  // the newest one told, until regroup() takes it
  std::thread reader, heartbeat;

  void send(const nlohmann::json& j) {
    std::lock_guard<std::mutex> l(send_mu);
    write_json_line(*conn, j);
  }
  // A notice the service may no longer be there to hear (the node is on its way out).
  void tell(const nlohmann::json& j) {
    try {
      send(j);
    } catch (const std::exception&) {
    }
  }
  void read_loop() {
    for (;;) {
      nlohmann::json m;
      try {
        m = read_json_line(*conn);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        if (!stop)
          error = fmt::format("the rendezvous service at {} ended the session ({})", where(), e.what()), ended = true;
        cv.notify_all();
        return;
      }
      const std::string op = m.value("op", "");
      std::lock_guard<std::mutex> l(mu);
      if (op == "pending") {
        pending = true;
      } else if (op == "waiting") {
        log::warn("[dist] waiting for the ring to re-form: node(s) {} present, {} missing ({})",
                  m.value("present", nlohmann::json::array()).dump(), m.value("missing", nlohmann::json::array()).dump(),
                  m.value("why", std::string()));
      } else if (op == "epoch") {
        try {
          Epoch e;
          e.number = m.at("epoch").get<int64_t>();
          e.root = m.at("root").get<int>();
          for (const auto& x : m.at("members"))
            e.members.push_back({x.at("node").get<int>(), x.at("host").get<std::string>(), x.at("port").get<uint16_t>(),
                                 x.at("step").get<int64_t>()});
          e.index = -1;
          for (size_t i = 0; i < e.members.size(); ++i)
            if (e.members[i].node == opt.hello.node) e.index = static_cast<int>(i);
          if (e.index < 0) throw std::runtime_error("this node is not a member");
          epoch = e;
          pending = false;
        } catch (const std::exception& ex) {
          error = fmt::format("the rendezvous service sent a malformed epoch ({})", ex.what());
        }
      } else if (op == "error") {
        error = "the rendezvous service: " + m.value("error", std::string("an error"));
      }
      cv.notify_all();
    }
  }
  void heartbeat_loop() {
    std::unique_lock<std::mutex> l(mu);
    while (!stop && !ended) {
      cv.wait_for(l, std::chrono::duration<double>(opt.heartbeat_s));
      if (stop || ended) return;
      l.unlock();
      tell({{"op", "hb"}});
      l.lock();
    }
  }
  std::string where() const { return fmt::format("{}:{}", opt.addr, opt.port); }
};

RendezvousSession::RendezvousSession(const RendezvousSessionOptions& o) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.opt = o;
  I.key = job_key(o.token);
  I.conn = std::make_unique<TcpConnection>(tcp_connect(I.io, o.addr, o.port, o.timeout_s, "the rendezvous service"),
                                           "the rendezvous service at " + I.where(), o.timeout_s);
  const std::string host = I.conn->socket().local_endpoint().address().to_string();
  I.listener = std::make_unique<TcpListener>(I.io, host, 0);
  I.opt.hello.host = host;
  I.opt.hello.port = I.listener->port();
  authenticate_peer(*I.conn, I.key, o.hello.node, 0);
  const MemberHello& h = I.opt.hello;
  I.send(hello_message(h));
  const nlohmann::json reply = read_json_line(*I.conn);
  SYN_CHECK(reply.value("op", "") == "welcome",
            fmt::format("the rendezvous service at {} refused node {}: {}", I.where(), h.node,
                        reply.value("error", std::string("no reason given"))),
            "start every node of the job with the same model, config and token, and a NODE_RANK no live node has");
  // From here the session is long-lived: its reads wait as long as the job runs.
  I.conn = std::make_unique<TcpConnection>(std::move(I.conn->socket()), "the rendezvous service at " + I.where(), 1e6);
  I.reader = std::thread([&I] { I.read_loop(); });
  I.heartbeat = std::thread([&I] { I.heartbeat_loop(); });
}

RendezvousSession::~RendezvousSession() {
  auto& I = *impl_;
  {
    std::lock_guard<std::mutex> l(I.mu);
    I.stop = true;
  }
  I.cv.notify_all();
  I.conn->shutdown();
  if (I.reader.joinable()) I.reader.join();
  if (I.heartbeat.joinable()) I.heartbeat.join();
}

Epoch RendezvousSession::regroup(int64_t step, double wait_limit_s, int unlinked) {
  auto& I = *impl_;
  {
    std::lock_guard<std::mutex> l(I.mu);
    SYN_CHECK(!I.ended, I.error, "restart the rendezvous service (syncopate-rendezvous), then the nodes with --resume");
    I.epoch.reset();
    I.error.clear();
  }
  nlohmann::json ask = {{"op", "regroup"}, {"step", step}};
  if (unlinked >= 0) ask["unlinked"] = unlinked;
  I.send(ask);
  std::unique_lock<std::mutex> l(I.mu);
  const bool told = I.cv.wait_for(l, std::chrono::duration<double>(wait_limit_s),
                                  [&] { return I.epoch.has_value() || !I.error.empty() || I.ended; });
  SYN_CHECK(I.error.empty(), I.error, "see the rendezvous service's log");
  SYN_CHECK(told && I.epoch, fmt::format("node {}: the ring did not re-form within {} s (dist.min_nodes_wait_s)",
                                          I.opt.hello.node, wait_limit_s),
            "the log above names the nodes it waited for: start them (with --resume), or lower dist.min_nodes");
  Epoch e = *I.epoch;
  I.epoch.reset();
  return e;
}

bool RendezvousSession::pending() const { return impl_->pending.load(); }

void RendezvousSession::leave() { impl_->tell({{"op", "leave"}}); }
void RendezvousSession::done() { impl_->tell({{"op", "done"}}); }

int RendezvousSession::node() const { return impl_->opt.hello.node; }
boost::asio::io_context& RendezvousSession::io() { return impl_->io; }
TcpListener& RendezvousSession::listener() { return *impl_->listener; }
const JobKey& RendezvousSession::key() const { return impl_->key; }
std::string RendezvousSession::where() const { return impl_->where(); }

}  // namespace syncopate
