// Time on the virtual cluster's wires. Every endpoint (worker or parameter-server shard) has a
// full-duplex link: an uplink and a downlink of its own rate, each serving messages first come,
// first served. A message of S bytes from a to b, handed over at time t:
//   leaves   tx = max(t, a's uplink free)                 a's uplink busy S / B_a
//   lands    rx = max(tx + latency, b's downlink free)     b's downlink busy S / B_b
//   arrives  max(tx + S / B_a + latency, rx + S / B_b)      (not before its last byte was sent)
// So W workers pushing S bytes each into one shard at once take W x S / B_shard to get in: the
// queueing that limits parameter servers at scale; a shard with a W times faster link takes them
// all in S / B. Messages a sender hands over at the same instant (a worker's pushes to its K
// shards, a shard's replies to the workers a clock released) share its uplink as TCP flows do:
// each leaves when the batch's last byte has left, tx + (sum of S) / B_a, so none of them can be
// answered before the whole batch is out (or, with fifo, one after the other: the first leaves after
// its own bytes). Messages handed over at different instants are served first come, first served;
// a receiver's downlink serves arrivals first come, first served.
// Flows (partitions, dist.ps_partition_mb): messages of one batch may be grouped into flows, one per
// connection (a worker's DEALER to one server): a flow sends its messages one after the other, and
// the flows share the uplink equally (processor sharing: when one flow has sent c bytes, every other
// has sent min(its total, c)), so the first partition of every shard lands long before the batch's
// last byte has left and the shard can answer it while the rest arrive.
// Shared links (sim.colocate_servers): endpoints may share one link, as a parameter-server shard
// started on a worker's node shares that node's NIC (scripts/local_cluster.sh --netns puts shard k
// on node k mod N). Their messages then queue on the same uplink and downlink, and a message between
// two endpoints of one link crosses no link at all: it arrives when it is handed over.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace syncopate {

class NetworkModel {
 public:
  // bytes_per_s[e]: endpoint e's link rate (each direction); latency_s: one way, per message.
  // fifo: messages handed over together are served one after the other instead of sharing the uplink.
  // link_of (optional): endpoint e's link is link_of[e], an index into bytes_per_s (the links'
  // rates); without it every endpoint has a link of its own (link_of[e] = e).
  NetworkModel(std::vector<double> bytes_per_s, double latency_s, bool fifo = false, std::vector<int> link_of = {});
  // Arrival time of a message of `bytes` handed to the network at time t (seconds).
  double send(int from, int to, double bytes, double t);
  // Arrival times of messages handed over together at time t, sharing the sender's uplink:
  // to[i] receives bytes[i].
  // flow (optional): message i's flow; without it every message is a flow of its own, all leaving at
  // the batch's end as above.
  std::vector<double> send_batch(int from, const std::vector<int>& to, const std::vector<double>& bytes, double t,
                                 const std::vector<int>* flow = nullptr);
  double latency_s() const { return latency_; }
  double rate(int e) const { return rate_.at(link(e)); }
  // Bytes each link sent and received so far (endpoint e's link; a message within one link counts nowhere).
  double sent(int e) const { return sent_.at(link(e)); }
  double received(int e) const { return received_.at(link(e)); }

 private:
  size_t link(int e) const;  // endpoint e's link (checked)
  std::vector<double> send_remote(size_t a, const std::vector<int>& to, const std::vector<double>& bytes, double t,
                                  const std::vector<int>* flow);
  std::vector<double> send_flows(size_t from, const std::vector<int>& to, const std::vector<double>& bytes,
                                 const std::vector<int>& flow, double tx, double total);
  std::vector<double> rate_, up_free_, down_free_, sent_, received_;  // per link
  std::vector<int> link_of_;                                         // per endpoint
  double latency_;
  bool fifo_;
};

// Seconds of the pipelined ring all-reduce (reduce-scatter, then all-gather) of `bytes` over n
// nodes whose links carry bytes_per_s each way: 2(n-1) phases, each moving one chunk of bytes/n
// over every link at once and paying one latency: 2(n-1) x (latency + bytes / (n x B)).
// 0 for n = 1.
double ring_allreduce_s(int64_t n, double bytes, double bytes_per_s, double latency_s);

}  // namespace syncopate
