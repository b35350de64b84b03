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
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace syncopate {

class NetworkModel {
 public:
  // bytes_per_s[e]: endpoint e's link rate (each direction); latency_s: one way, per message.
  // fifo: messages handed over together are served one after the other instead of sharing the uplink.
  NetworkModel(std::vector<double> bytes_per_s, double latency_s, bool fifo = false);
  // Arrival time of a message of `bytes` handed to the network at time t (seconds).
  double send(int from, int to, double bytes, double t);
  // Arrival times of messages handed over together at time t, sharing the sender's uplink:
  // to[i] receives bytes[i].
  // flow (optional): message i's flow; without it every message is a flow of its own, all leaving at
  // the batch's end as above.
  std::vector<double> send_batch(int from, const std::vector<int>& to, const std::vector<double>& bytes, double t,
                                 const std::vector<int>* flow = nullptr);
  double latency_s() const { return latency_; }
  double rate(int e) const { return rate_.at(static_cast<size_t>(e)); }
  // Bytes each endpoint sent and received so far.
  double sent(int e) const { return sent_.at(static_cast<size_t>(e)); }
  double received(int e) const { return received_.at(static_cast<size_t>(e)); }

 private:
  std::vector<double> send_flows(size_t from, const std::vector<int>& to, const std::vector<double>& bytes,
                                 const std::vector<int>& flow, double tx, double total);
  std::vector<double> rate_, up_free_, down_free_, sent_, received_;
  double latency_;
  bool fifo_;
};

// Seconds of the pipelined ring all-reduce (reduce-scatter, then all-gather) of `bytes` over n
// nodes whose links carry bytes_per_s each way: 2(n-1) phases, each moving one chunk of bytes/n
// over every link at once and paying one latency: 2(n-1) x (latency + bytes / (n x B)).
// 0 for n = 1.
double ring_allreduce_s(int64_t n, double bytes, double bytes_per_s, double latency_s);

}  // namespace syncopate
