#include "common/rendezvous.h"

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
#include "common/transport/striped_connection.h"
#include "common/transport/tcp_connection.h"

namespace syncopate {
namespace {

using nlohmann::json;

void write_line(Connection& c, const json& j) {
  std::string line = j.dump() + "\n";
  c.send(line.data(), line.size());
}

// One JSON line, at most 64 KiB, within the connection's timeout (a silent or flooding peer
// cannot stall the rendezvous past it).
json read_line(Connection& c) {
  std::string line;
  for (char ch = 0; line.size() < (64 << 10);) {
    c.recv(&ch, 1);
    if (ch == '\n') break;
    line.push_back(ch);
  }
  try {
    return json::parse(line);
  } catch (const json::exception&) {
    SYN_FAIL(fmt::format("rendezvous: {} sent a malformed message", c.peer()), "is something else using MASTER_PORT?");
  }
}

}  // namespace

int64_t newest_common_step(const std::vector<std::vector<int64_t>>& per_node) {
  if (per_node.empty()) return -1;
  std::set<int64_t> common(per_node[0].begin(), per_node[0].end());
  for (size_t i = 1; i < per_node.size(); ++i) {
    std::set<int64_t> mine(per_node[i].begin(), per_node[i].end()), both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::inserter(both, both.end()));
    common.swap(both);
  }
  return common.empty() ? -1 : *common.rbegin();
}

namespace {
std::string describe_steps(const std::vector<std::vector<int64_t>>& per_node) {
  std::string s;
  for (size_t r = 0; r < per_node.size(); ++r)
    s += fmt::format("{}node {}: {}", r ? "; " : "", r,
                     per_node[r].empty() ? std::string("none") : fmt::format("{}", fmt::join(per_node[r], ",")));
  return s;
}
}  // namespace

Ring connect_ring(const RendezvousOptions& o) {
  SYN_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes,
            fmt::format("NODE_RANK={} is outside 0..NNODES-1 (NNODES={})", o.node_rank, o.nnodes),
            "give every node a distinct NODE_RANK below NNODES");
  Ring ring;
  ring.rank = o.node_rank;
  ring.world = o.nnodes;
  if (o.nnodes == 1) {
    ring.resume_step = o.checkpoints.empty() ? -1 : *std::max_element(o.checkpoints.begin(), o.checkpoints.end());
    return ring;
  }

  auto io_owner = std::make_shared<asio::io_context>();
  asio::io_context& io = *io_owner;
  ring.transport = io_owner;
  const uint64_t digest = token_digest(o.token);
  std::vector<std::pair<std::string, uint16_t>> nodes(static_cast<size_t>(o.nnodes));
  std::unique_ptr<TcpListener> data;

  if (o.node_rank == 0) {
    TcpListener rdv(io, o.master_addr, o.master_port);
    if (o.on_listening) o.on_listening(rdv.port());
    data = std::make_unique<TcpListener>(io, o.master_addr, 0);
    nodes[0] = {o.master_addr, data->port()};
    std::map<int, std::unique_ptr<TcpConnection>> peers;
    std::vector<std::vector<int64_t>> steps(static_cast<size_t>(o.nnodes));
    steps[0] = o.checkpoints;
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
        hello = read_line(*s);
      } catch (const Error&) {
        continue;  // garbage, silence or a port scanner: drop it, keep waiting for real nodes
      }
      if (!hello.is_object() || hello.value("token", json()) != json(digest)) {
        try { write_line(*s, {{"error", "wrong job token"}}); } catch (...) {}
        continue;  // another job's node: refuse it, keep waiting for ours
      }
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
        error = fmt::format("node {} runs another model/config (fingerprint {} != {})", r, hello.value("fingerprint", ""), o.fingerprint);
      }
      if (r > 0 && r < o.nnodes && !peers.count(r)) {
        nodes[static_cast<size_t>(r)] = {hello.value("host", ""), hello.value("port", uint16_t{0})};
        try {
          steps[static_cast<size_t>(r)] = hello.value("checkpoints", std::vector<int64_t>{});
        } catch (const json::exception&) {
          error = fmt::format("node {} sent a malformed checkpoint list", r);
        }
        peers.emplace(r, std::move(s));
      }
      if (!error.empty()) break;
    }
    bool any = false;
    for (const auto& v : steps) any = any || !v.empty();
    ring.resume_step = newest_common_step(steps);
    if (error.empty() && any && ring.resume_step < 0)
      error = "no checkpoint step is held by every node (" + describe_steps(steps) +
              "); copy a checkpoint to the nodes that lack it, or start without --resume";
    json table = json::array();
    for (auto& [h, p] : nodes) table.push_back({{"host", h}, {"port", p}});
    for (auto& [r, s] : peers) {
      try {
        write_line(*s, error.empty() ? json{{"nodes", table}, {"resume_step", ring.resume_step}} : json{{"error", error}});
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
    write_line(s, {{"token", digest}, {"node_rank", o.node_rank}, {"host", my_host}, {"port", data->port()},
                   {"fingerprint", o.fingerprint}, {"checkpoints", o.checkpoints}, {"streams", o.streams}, {"lanes", o.lanes}});
    json reply = read_line(s);
    SYN_CHECK(!reply.contains("error"), "rendezvous failed: " + reply.value("error", std::string()),
              "start every node with the same config, token and distinct NODE_RANKs");
    ring.resume_step = reply.value("resume_step", int64_t{-1});
    for (size_t r = 0; r < nodes.size(); ++r)
      nodes[r] = {reply["nodes"][r]["host"].get<std::string>(), reply["nodes"][r]["port"].get<uint16_t>()};
  }

  // Ring links: connect to the next node while accepting the previous one.
  const int next = (o.node_rank + 1) % o.nnodes, prev = (o.node_rank + o.nnodes - 1) % o.nnodes;
  auto name = [&](int r) { return fmt::format("node {} at {}:{}", r, nodes[r].first, nodes[r].second); };
  const int k = std::max(1, o.streams), total = k * std::max(1, o.lanes);
  auto out = std::async(std::launch::async, [&] {
    std::vector<std::unique_ptr<Connection>> links;
    for (int i = 0; i < total; ++i) {
      auto c = std::make_unique<TcpConnection>(
          tcp_connect(io, nodes[next].first, nodes[next].second, o.timeout_s, name(next)), name(next), o.timeout_s);
      exchange_hello(*c, digest, o.node_rank, next);
      links.push_back(std::move(c));
    }
    return links;
  });
  std::vector<std::unique_ptr<Connection>> in;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
  while (static_cast<int>(in.size()) < total) {  // a stranger on the data port is refused; keep waiting for the neighbour
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    auto c = std::make_unique<TcpConnection>(data->accept(std::max(left, 0.0), name(prev)), name(prev), o.timeout_s);
    try {
      exchange_hello(*c, digest, o.node_rank, prev);
      in.push_back(std::move(c));
    } catch (const Error&) {
      SYN_CHECK(std::chrono::steady_clock::now() < deadline, fmt::format("{} never completed the handshake", name(prev)),
                "check SYNCOPATE_TOKEN on every node");
    }
  }
  // Lane l is connections [l*k, l*k+k): one connection, or k striped together.
  auto join = [k](std::vector<std::unique_ptr<Connection>>& links, int lane) -> std::unique_ptr<Connection> {
    if (k == 1) return std::move(links[static_cast<size_t>(lane)]);
    std::vector<std::unique_ptr<Connection>> mine;
    for (int i = 0; i < k; ++i) mine.push_back(std::move(links[static_cast<size_t>(lane * k + i)]));
    return std::make_unique<StripedConnection>(std::move(mine));
  };
  std::vector<std::unique_ptr<Connection>> outs = out.get();
  ring.next = join(outs, 0);
  ring.prev = join(in, 0);
  for (int lane = 1; lane < total / k; ++lane) {
    ring.more_next.push_back(join(outs, lane));
    ring.more_prev.push_back(join(in, lane));
  }
  return ring;
}

}  // namespace syncopate
