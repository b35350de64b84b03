#include "common/comm/rendezvous.h"

#include <chrono>
#include <future>
#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>
#include <fmt/ranges.h>

#include "common/check.h"
#include "common/comm/json_lines.h"
#include "common/comm/peer_auth.h"
#include "common/comm/transport/delayed_connection.h"
#include "common/comm/transport/striped_connection.h"
#include "common/comm/transport/tcp_connection.h"

namespace syncopate {
namespace {
int64_t unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

using nlohmann::json;

void connect_ring_links(Ring& ring, asio::io_context& io, TcpListener& listener, const JobKey& key, const RingLinksPlan& p) {
  const int k = std::max(1, p.streams), total = k * std::max(1, p.lanes);
  // Every connection opens with the challenge-response, then the connecting side's epoch: a
  // connection of another (older) epoch left in the listener's queue is dropped, not taken.
  auto out = std::async(std::launch::async, [&] {
    std::vector<std::unique_ptr<Connection>> links;
    for (int i = 0; i < total; ++i) {
      asio::ip::tcp::socket s(io);
      try {
        s = tcp_connect(io, p.next_host, p.next_port, p.timeout_s, p.next_name);
      } catch (const Error&) {
        if (p.next_unreachable) *p.next_unreachable = true;
        throw;
      }
      auto c = std::make_unique<TcpConnection>(std::move(s), p.next_name, p.timeout_s);
      authenticate_peer(*c, key, p.self, p.next);
      c->send(&p.epoch, sizeof(p.epoch));
      links.push_back(std::move(c));
    }
    return links;
  });
  std::vector<std::unique_ptr<Connection>> in;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(p.timeout_s);
  while (static_cast<int>(in.size()) < total) {  // a stranger on the data port is refused; keep waiting for the neighbour
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    auto c = std::make_unique<TcpConnection>(listener.accept(std::max(left, 0.0), p.prev_name), p.prev_name, p.timeout_s);
    try {
      authenticate_peer(*c, key, p.self, p.prev);
      int64_t epoch = -1;
      c->recv(&epoch, sizeof(epoch));
      if (epoch == p.epoch) in.push_back(std::move(c));
    } catch (const Error&) {
      SYN_CHECK(std::chrono::steady_clock::now() < deadline, fmt::format("{} never completed the handshake", p.prev_name),
                "check SYNCOPATE_TOKEN on every node");
    }
  }
  std::vector<std::unique_ptr<Connection>> outs = out.get();
  // After the handshake, so the delay line carries the collectives' bytes only; on the links a node
  // receives from (prev): the ring never receives on its sending links, which need no reader thread.
  if (p.latency_s > 0)
    for (auto& c : in) c = std::make_unique<DelayedConnection>(std::move(c), p.latency_s, p.timeout_s);
  // Lane l is connections [l*k, l*k+k): one connection, or k striped together.
  auto join = [k](std::vector<std::unique_ptr<Connection>>& links, int lane) -> std::unique_ptr<Connection> {
    if (k == 1) return std::move(links[static_cast<size_t>(lane)]);
    std::vector<std::unique_ptr<Connection>> mine;
    for (int i = 0; i < k; ++i) mine.push_back(std::move(links[static_cast<size_t>(lane * k + i)]));
    return std::make_unique<StripedConnection>(std::move(mine));
  };
  ring.next = join(outs, 0);
  ring.prev = join(in, 0);
  for (int lane = 1; lane < total / k; ++lane) {
    ring.more_next.push_back(join(outs, lane));
    ring.more_prev.push_back(join(in, lane));
  }
}

Ring connect_ring(const RendezvousOptions& o) {
  SYN_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes,
            fmt::format("NODE_RANK={} is outside 0..NNODES-1 (NNODES={})", o.node_rank, o.nnodes),
            "give every node a distinct NODE_RANK below NNODES");
  Ring ring;
  ring.rank = o.node_rank;
  ring.world = o.nnodes;
  if (o.nnodes == 1) {
    ring.blobs = {o.blob};
    return ring;
  }

  auto io_owner = std::make_shared<asio::io_context>();
  asio::io_context& io = *io_owner;
  ring.transport = io_owner;
  const JobKey key = job_key(o.token);
  std::vector<std::pair<std::string, uint16_t>> nodes(static_cast<size_t>(o.nnodes));
  std::unique_ptr<TcpListener> data;

  if (o.node_rank == 0) {
    TcpListener rdv(io, o.master_addr, o.master_port);
    if (o.on_listening) o.on_listening(rdv.port());
    data = std::make_unique<TcpListener>(io, o.master_addr, 0);
    nodes[0] = {o.master_addr, data->port()};
    std::map<int, std::unique_ptr<TcpConnection>> peers;
    std::vector<std::string> blobs(static_cast<size_t>(o.nnodes));
    blobs[0] = o.blob;
    std::string error;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
    while (static_cast<int>(peers.size()) < o.nnodes - 1) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      std::string missing;
      for (int r = 1; r < o.nnodes; ++r)
        if (!peers.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      auto s = std::make_unique<TcpConnection>(rdv.accept(std::max(left, 0.0), "node(s) " + missing),
                                               "a connecting node", std::min(std::max(left, 1.0), 10.0));
      json hello;
      try {
        authenticate_peer(*s, key, 0, -1);  // challenge-response over the job token (peer_auth.h)
        hello = read_json_line(*s);
      } catch (const Error&) {
        continue;  // garbage, silence, a port scanner or another job's node: drop it, keep waiting for ours
      }
      if (!hello.is_object()) continue;
      const int r = hello.value("node_rank", -1);
      if (r <= 0 || r >= o.nnodes || peers.count(r)) {
        error = fmt::format("a node announced NODE_RANK={} which is {}", r, r <= 0 || r >= o.nnodes ? "out of range" : "taken twice");
      } else if (hello.value("streams", 1) != o.streams) {
        error = fmt::format("node {} opens {} TCP streams per ring link, node 0 opens {}", r, hello.value("streams", 1),
                            o.streams);
      } else if (hello.value("lanes", 1) != o.lanes) {
        error = fmt::format("node {} opens {} ring lanes, node 0 opens {} (one per local replica with dist.hierarchy=sliced, "
                            "else one)", r, hello.value("lanes", 1), o.lanes);
      } else if (hello.value("fingerprint", "") != o.fingerprint) {
        error = fmt::format("node {} runs another model/config than node 0 (fingerprint '{}' != '{}': the hash covers the "
                            "model, optimizer, schedule and run length; the synchronization's fields are written out)",
                            r, hello.value("fingerprint", ""), o.fingerprint);
      }
      if (r > 0 && r < o.nnodes && !peers.count(r)) {
        nodes[static_cast<size_t>(r)] = {hello.value("host", ""), hello.value("port", uint16_t{0})};
        const json b = hello.value("blob", json(""));
        if (b.is_string()) blobs[static_cast<size_t>(r)] = b.get<std::string>();
        else error = fmt::format("node {} sent a malformed blob", r);
        peers.emplace(r, std::move(s));
      }
      if (!error.empty()) break;
    }
    ring.blobs = blobs;
    json table = json::array();
    for (auto& [h, p] : nodes) table.push_back({{"host", h}, {"port", p}});
    for (auto& [r, s] : peers) {
      try {
        write_json_line(*s, error.empty() ? json{{"nodes", table}, {"blobs", blobs}, {"time_us", unix_us()}} : json{{"error", error}});
      } catch (...) {}
    }
    SYN_CHECK(error.empty(), "rendezvous failed: " + error,
              "start every node with the same config (dist.streams included), the same number of local replicas "
              "(dist.local_replicas, or the same GPU count) and distinct NODE_RANKs");
  } else {
    TcpConnection s(tcp_connect(io, o.master_addr, o.master_port, o.timeout_s, "node 0 (rendezvous)"),
                    fmt::format("node 0 at {}:{}", o.master_addr, o.master_port), o.timeout_s);
    const std::string my_host = s.socket().local_endpoint().address().to_string();
    data = std::make_unique<TcpListener>(io, my_host, 0);
    authenticate_peer(s, key, o.node_rank, 0);
    write_json_line(s, {{"node_rank", o.node_rank}, {"host", my_host}, {"port", data->port()},
                   {"fingerprint", o.fingerprint}, {"blob", o.blob}, {"streams", o.streams}, {"lanes", o.lanes}});
    json reply = read_json_line(s);
    ring.clock_offset_us = static_cast<double>(unix_us() - reply.value("time_us", unix_us()));
    SYN_CHECK(!reply.contains("error"), "rendezvous failed: " + reply.value("error", std::string()),
              "start every node with the same config, token and distinct NODE_RANKs");
    try {
      ring.blobs = reply.at("blobs").get<std::vector<std::string>>();
    } catch (const json::exception&) {
      SYN_FAIL("rendezvous: node 0's reply carries no blobs", "run the same Syncopate build on every node");
    }
    for (size_t r = 0; r < nodes.size(); ++r)
      nodes[r] = {reply["nodes"][r]["host"].get<std::string>(), reply["nodes"][r]["port"].get<uint16_t>()};
  }

  // Ring links: connect to the next node while accepting the previous one.
  const int next = (o.node_rank + 1) % o.nnodes, prev = (o.node_rank + o.nnodes - 1) % o.nnodes;
  RingLinksPlan plan;
  plan.self = o.node_rank, plan.next = next, plan.prev = prev;
  plan.next_host = nodes[next].first, plan.next_port = nodes[next].second;
  plan.next_name = fmt::format("node {} at {}:{}", next, nodes[next].first, nodes[next].second);
  plan.prev_name = fmt::format("node {} at {}:{}", prev, nodes[prev].first, nodes[prev].second);
  plan.streams = o.streams, plan.lanes = o.lanes, plan.timeout_s = o.timeout_s, plan.latency_s = o.latency_s;
  connect_ring_links(ring, io, *data, key, plan);
  return ring;
}

}  // namespace syncopate
