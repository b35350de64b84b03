// A job's per-step exchange timed at the model's size, for syncopate-probe (issue 29): every node of
// the job exchanges a gradient of the model's size at once, round after round, each round `gap_s`
// after the previous one ended, as a job's next exchange follows its step's compute (back to back, a
// round's traffic would meet the previous round's still on the links, which a step's compute keeps
// apart; and a link's rate limiter refills during the gap, as it does in a job). Two patterns:
//  - the ring: a ring all-reduce of the model's size over the probe's ring (what ring data
//    parallelism and ring local SGD pay per exchange; common/comm/ring_allreduce.h);
//  - the parameter servers: every node pushes a gradient of the model's size to the job's shards,
//    started under BSP, and takes their reply (the part's new values), so every round is released to
//    every node together: pushes that converge on the shards at once (incast), replies that leave
//    them at once, TCP's losses and retransmissions, the shards' own update time. That is what BSP,
//    BSP with backup workers and synchronous local SGD on the servers pay per step. The gradient is
//    zero and so are the values: the shards' state never changes. The shards are the probe's after
//    it (their layout is registered under the probe's digest): start the job's servers afresh.
//  - the parameter servers, pushes spread out: the same round trip to shards that run ASP (the
//    probe's own, on the nodes where the job's shards run), node r starting r/world of a gap after
//    node 0, so the pushes arrive one after another as an asynchronous job's do once its nodes'
//    phases have spread: what ASP, SSP and asynchronous local SGD pay per push, without BSP's incast.
// Both move the job's wire format (dist.wire; the ring's all-reduce in float32 where it is int8, which
// the ring does not carry; the servers' replies in float32, as in a job), as the advisor's ratio counts
// the job's bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/comm/transport/connection.h"
#include "common/comm/wire_format.h"
#include "server/ps_client.h"

namespace syncopate {

struct ExchangeProbe {
  std::vector<double> round_s;  // each timed round: the exchange's start to its end on this node, seconds (gap excluded)
  int64_t bytes_sent = 0;       // bytes this node sent per round
  int64_t bytes_received = 0;   // bytes it received per round
  int parts = 0;                // parameter servers: parts pushed per round (dist.ps_partition_mb)
};

// The ring all-reduce of `params` float32 values between `world` nodes over the ring's connections:
// `warmup` untimed then `rounds` timed rounds, each after a pause of gap_s seconds. Throws
// syncopate::Error naming the peer that failed.
ExchangeProbe probe_ring_rounds(int rank, int world, Connection& next, Connection& prev, int64_t params, int rounds,
                                int warmup, double gap_s, WireFormat wire = WireFormat::kF32);

// Registers `rank` of `world` with the shards at `endpoints` (INIT of `params` zeros, clock 0), runs
// `warmup` untimed then `rounds` timed BSP rounds, each after a pause of gap_s seconds, and leaves
// (FINISH, also when a round failed, so that the others' rounds do not wait for this node). Throws
// syncopate::Error naming the shard that failed or stayed silent past options.timeout_s, or saying
// that the shards do not run BSP (the rounds would not be a BSP exchange).
ExchangeProbe probe_ps_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank, int world,
                              PsClientOptions options, int64_t params, int rounds, int warmup, double gap_s);

// The same against shards that run ASP (refused by name where a reply carries a BSP round), this node's
// first round offset_s seconds after the others' common start (rank / world x gap_s spreads them).
ExchangeProbe probe_ps_spread_rounds(const std::vector<std::string>& endpoints, const std::string& token, int rank,
                                     int world, PsClientOptions options, int64_t params, int rounds, int warmup,
                                     double gap_s, double offset_s);

}  // namespace syncopate
