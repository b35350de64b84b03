// Rendezvous of the nodes of one job and the ring connections between them.
//
// Node 0 listens on MASTER_ADDR:MASTER_PORT just for the rendezvous. Every other node connects,
// both prove the job token by challenge-response (peer_auth.h), then it sends one JSON line
// {node_rank, host, port, fingerprint} (host:port is its own
// data listener, bound to the address it reaches the master from), and node 0 answers every node
// with the table of all nodes, or with an error (wrong token, duplicate rank, another model/config
// fingerprint) that every node then reports. Node 0's rendezvous socket closes afterwards.
// Each node may also send an opaque blob (a string the job defines: the checkpoint steps it
// holds, for instance); every node receives every node's blob, so that all make the same decision
// from the same facts (the rendezvous itself decides nothing but membership).
// Then node r connects to node r+1's data listener and accepts node r-1; both connections start
// with the same challenge-response. With streams = k > 1 each link is k TCP connections, opened one after
// another (each handshake completes before the next connect, so both ends agree on their order)
// and used as one StripedConnection. With lanes = L > 1 each link is L independent rings' worth of
// connections (lane l = connections l*k .. l*k+k-1): local replica l of every node rings its own
// slice over lane l (hierarchical all-reduce).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm/peer_auth.h"
#include "common/comm/transport/connection.h"

namespace boost::asio {
class io_context;
}

namespace syncopate {
class TcpListener;

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";  // node 0's address (MASTER_ADDR)
  uint16_t master_port = 29500;           // rendezvous port on node 0 (MASTER_PORT); 0 = ephemeral (tests)
  int nnodes = 1;                         // nodes in the job (NNODES)
  int node_rank = 0;                      // this node (NODE_RANK), 0..nnodes-1
  std::string token;                      // shared job secret (SYNCOPATE_TOKEN)
  std::string fingerprint;                // digest of model + config; must agree on every node
  std::string blob;                       // opaque to the rendezvous; handed to every node (Ring::blobs)
  int streams = 1;                        // TCP streams per ring link (>1: StripedConnection); same on all nodes
  int lanes = 1;                          // independent rings over the same nodes (one per local replica); same on all nodes
  double timeout_s = 60;                  // for the rendezvous and every later blocking send/recv
  double latency_s = 0;                   // emulation: one-way delay of every ring message this node receives,
                                          // seconds (a DelayedConnection on each link); 0 = the link's own
  std::function<void(uint16_t)> on_listening;  // called by node 0 with its rendezvous port
};

struct Ring {
  int rank = 0, world = 1;
  std::shared_ptr<void> transport;   // keeps the transport's context alive as long as the links
  std::unique_ptr<Connection> next;  // to (rank+1) % world; null when world == 1
  std::unique_ptr<Connection> prev;  // from (rank-1) % world
  std::vector<std::string> blobs;    // every node's RendezvousOptions::blob, by node rank
  double clock_offset_us = 0;        // this node's system clock minus node 0's, as read at the rendezvous
                                     // (node 0 stamps its reply; the error is the reply's one-way delay)
  std::vector<std::unique_ptr<Connection>> more_next, more_prev;  // lanes 1..L-1 (lane 0 is next/prev)

  int lanes() const { return world == 1 ? 0 : 1 + static_cast<int>(more_next.size()); }
  Connection& next_of(int lane) { return lane == 0 ? *next : *more_next.at(static_cast<size_t>(lane - 1)); }
  Connection& prev_of(int lane) { return lane == 0 ? *prev : *more_prev.at(static_cast<size_t>(lane - 1)); }
  // Ends every link of every lane (see Connection::shutdown); safe while other threads use them.
  void shutdown() {
    for (int l = 0; l < lanes(); ++l) {
      next_of(l).shutdown();
      prev_of(l).shutdown();
    }
  }

  Ring() = default;
  Ring(Ring&&) = default;
  // The links go before the context they live in (member-wise assignment would free it first).
  Ring& operator=(Ring&& o) noexcept {
    next.reset();
    prev.reset();
    more_next.clear();
    more_prev.clear();
    rank = o.rank, world = o.world, blobs = std::move(o.blobs), clock_offset_us = o.clock_offset_us;
    transport = std::move(o.transport);
    next = std::move(o.next);
    prev = std::move(o.prev);
    more_next = std::move(o.more_next);
    more_prev = std::move(o.more_prev);
    return *this;
  }
};

// One node's links in a ring whose members it already knows (connect_ring after its rendezvous;
// an elastic ring after each epoch of the rendezvous service): it connects to the next node's
// listener while it accepts the previous node on its own. Every connection opens with the
// challenge-response (identities: the node ranks) and the connecting side's epoch; a connection
// of another epoch (left queued by a re-formation that broke off) is dropped.
struct RingLinksPlan {
  int self = 0, next = 0, prev = 0;  // node ranks
  std::string next_host;             // the next node's listener
  uint16_t next_port = 0;
  std::string next_name, prev_name;  // "node 2 at 10.0.0.3:41234", for messages
  int64_t epoch = 0;                 // 0: a fixed ring
  int streams = 1, lanes = 1;        // as RendezvousOptions
  double timeout_s = 60, latency_s = 0;
  bool* next_unreachable = nullptr;  // if given: set when connecting to the next node failed (not the accept side)
};
void connect_ring_links(Ring& ring, boost::asio::io_context& io, TcpListener& listener, const JobKey& key, const RingLinksPlan& p);

// Blocks until all nodes arrived and the ring is connected; throws syncopate::Error with a message
// naming the missing or mismatched node otherwise.
Ring connect_ring(const RendezvousOptions& opt);

}  // namespace syncopate
