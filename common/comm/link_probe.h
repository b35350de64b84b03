// What a job's links can do, measured over the ring's own connections (syncopate-probe): every node
// times round trips and a bulk transfer on its link to the next node while it answers the previous
// node's, so every link of the ring is measured at once and under the load the ring puts on it.
//
//   round trips:  next.send(8 B) -> the next node echoes it on its prev -> next.recv(8 B), `pings` times
//   goodput:      next.send(size header, size bytes) -> the next node answers 8 B once all have arrived;
//                 size doubles from min_bytes until a transfer's data time (elapsed - median round trip)
//                 is at least `seconds` (or max_bytes); that size is sent `repeats` times in all, and
//                 goodput = size / the shortest of their times (a transfer stalled by a descheduled
//                 receiver on a loaded host measures the host, not the link; every repeat is kept)
//
// Written against Connection (the transport is the caller's): both directions of each connection are
// used, so a transport must be full duplex (TCP is; the one-way memory channels are not).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/transport/connection.h"

namespace syncopate {

struct LinkProbeOptions {
  int pings = 30;                    // round trips timed per link (the first 3 are warm-up, not kept)
  double seconds = 0.5;              // a transfer doubles until its data (less a round trip) take this long, seconds
  size_t min_bytes = size_t{1} << 20;    // the first transfer, bytes
  size_t max_bytes = size_t{256} << 20;  // the largest transfer, bytes (a slow link stops at `seconds`)
  int repeats = 3;                   // transfers of the final size; the fastest is the goodput (>= 1)
};

struct LinkProbe {                   // this node's link to the next node
  std::vector<double> rtt_us;        // each timed round trip, microseconds
  double goodput_gbit = 0;           // bytes / time of the fastest transfer of the final size, Gbit/s (1e9 bits)
  uint64_t bytes = 0;                // that size, bytes
  double seconds = 0;                // that transfer's time from the first byte sent to the answer, less one median round trip
  std::vector<double> repeats_gbit;  // the goodput of each transfer of the final size, in order
};

// Runs on every node of a ring at once (world >= 2); next/prev as in Ring. Returns what this node
// measured of its link to the next node. Throws the transport's error (naming the peer) when a
// neighbour dies or stalls: the error of the side (next or prev) that failed first.
LinkProbe probe_link(Connection& next, Connection& prev, const LinkProbeOptions& o);

// Every node's string, in rank order, on every node: world - 1 rounds of passing the string received
// last round to the next node (a ring all-gather). Strings of any length (a u64 length prefix).
std::vector<std::string> ring_all_gather(int rank, int world, Connection& next, Connection& prev, const std::string& mine);

// Quantile q (0..1) of v by linear interpolation between order statistics; 0 for an empty v.
double quantile(std::vector<double> v, double q);

}  // namespace syncopate
