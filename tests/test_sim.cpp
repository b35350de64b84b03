// The virtual-time cluster (experiments/sim): its clock, its links, and simulations checked against
// the real trainer (the reference) and against the closed-form times they must produce.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "experiments/sim/event_queue.h"
#include "experiments/sim/network_model.h"
#include "experiments/sim/virtual_cluster.h"
#include "model/flat_parameters.h"
#include "model/gpt.h"
#include "test_helpers.h"
#include "worker/sync/bucket_reducer.h"
#include "worker/sync/gradient_sync.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/trainer.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> steps_of(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (auto& m : test::read_jsonl(path))
    if (m.contains("loss")) out.push_back(m);
  return out;
}
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A small job for the simulator: the tests' tiny model, 4 sequences of 32 tokens per worker-step.
struct SimJob {
  RunConfig run;
  PsConfig ps;
  SimConfig sim;
};
SimJob sim_job(const test::TempDir& d, const std::string& mode, int workers) {
  SimJob j;
  j.run = test::tiny_run_config(d);
  j.run.dist.mode = mode;
  j.run.emulate.step_time_s = 0.1;
  j.run.eval.every = 3;
  j.sim.workers = workers;
  j.sim.link_gbit = 1;
  j.sim.latency_us = 50;
  return j;
}

}  // namespace

TEST(EventQueue, OrdersByTimeThenBySchedulingOrder) {
  EventQueue<int> q;
  q.push(2.0, 1);
  q.push(1.0, 2);
  q.push(2.0, 3);
  q.push(1.0, 4);
  std::vector<int> order;
  while (!q.empty()) order.push_back(q.pop().second);
  EXPECT_EQ(order, (std::vector<int>{2, 4, 1, 3}));
  EXPECT_EQ(q.now(), 2.0);
  EXPECT_NE(test::error_of([&] { q.push(1.5, 0); }), "");  // before now: refused
}

TEST(NetworkModel, OneMessageTakesLatencyPlusBytesOverRate) {
  NetworkModel net({1e9, 1e9}, 1e-4);
  EXPECT_DOUBLE_EQ(net.send(0, 1, 1e6, 0.0), 1e-3 + 1e-4);
  EXPECT_DOUBLE_EQ(net.sent(0), 1e6);
  EXPECT_DOUBLE_EQ(net.received(1), 1e6);
}

TEST(NetworkModel, PushesIntoOneShardQueueAtItsLink) {
  const int W = 8;
  const double S = 1e6, B = 1e9, lat = 1e-4;
  // Same rate as the workers: the shard's downlink takes them one after the other.
  std::vector<double> rates(W + 1, B);
  NetworkModel net(rates, lat);
  double last = 0;
  for (int w = 0; w < W; ++w) last = std::max(last, net.send(w, W, S, 0.0));
  EXPECT_NEAR(last, W * S / B + lat, 1e-12);
  // A shard with W times the rate takes them all in at the workers' pace (K x B_server >= W x B).
  rates[W] = W * B;
  NetworkModel fast(rates, lat);
  for (int w = 0; w < W; ++w) EXPECT_NEAR(fast.send(w, W, S, 0.0), S / B + lat, 1e-12) << w;
  // Messages handed over together share the sender's uplink: all are out when the last byte is.
  NetworkModel shared(std::vector<double>(W + 1, B), lat);
  std::vector<int> to;
  for (int k = 1; k <= W; ++k) to.push_back(k);
  for (double a : shared.send_batch(0, to, std::vector<double>(W, S), 0.0)) EXPECT_NEAR(a, W * S / B + lat, 1e-12);
  // ... or, fifo, one after the other: the k-th is out after k messages' bytes.
  NetworkModel fifo(std::vector<double>(W + 1, B), lat, /*fifo=*/true);
  const std::vector<double> in_order = fifo.send_batch(0, to, std::vector<double>(W, S), 0.0);
  for (int k = 0; k < W; ++k) EXPECT_NEAR(in_order[static_cast<size_t>(k)], (k + 1) * S / B + lat, 1e-12) << k;
  // A worker's second message waits for its first on its own uplink.
  NetworkModel one({B, B, B}, 0.0);
  one.send(0, 1, S, 0.0);
  EXPECT_NEAR(one.send(0, 2, S, 0.0), 2 * S / B, 1e-12);
}

// Partitions: one flow per connection (a worker's DEALER to one server), its messages in order, the
// flows sharing the uplink. Two flows of two 1 MB messages at 1 MB/s: each flow's first message is
// out after 2 s (1 MB of each flow has left), its second after 4 s; without flows, all at 4 s.
TEST(NetworkModel, FlowsShareTheUplinkAndSendTheirMessagesInOrder) {
  const double S = 1e6, B = 1e6, lat = 0.01;
  const std::vector<int> to{1, 1, 2, 2};
  NetworkModel flows({B, 10 * B, 10 * B}, lat);  // fast downlinks: the sender's uplink sets the pace
  const std::vector<double> a = flows.send_batch(0, to, {S, S, S, S}, 0.0, &to);
  EXPECT_NEAR(a[0], 2.0 + lat, 1e-9);
  EXPECT_NEAR(a[1], 4.0 + lat, 1e-9);
  EXPECT_NEAR(a[2], 2.0 + lat, 1e-9);
  EXPECT_NEAR(a[3], 4.0 + lat, 1e-9);
  NetworkModel batch({B, 10 * B, 10 * B}, lat);
  for (double x : batch.send_batch(0, to, {S, S, S, S}, 0.0)) EXPECT_NEAR(x, 4.0 + lat, 1e-9);
  // Unequal flows: the short one (0.5 MB) is out after 1 s (0.5 MB of each), the long one's first
  // megabyte after 1.5 s, its second after 2.5 s.
  NetworkModel uneven({B, 10 * B, 10 * B}, 0.0);
  const std::vector<int> to2{1, 2, 2};
  const std::vector<double> b = uneven.send_batch(0, to2, {0.5 * S, S, S}, 0.0, &to2);
  EXPECT_NEAR(b[0], 1.0, 1e-9);
  EXPECT_NEAR(b[1], 1.5, 1e-9);
  EXPECT_NEAR(b[2], 2.5, 1e-9);
}

// Shared links (sim.colocate_servers): two workers (endpoints 0, 1) and two shards (2, 3) on their
// nodes' links (link_of = {0, 1, 0, 1}). A push to the shard on the worker's own node crosses no link;
// one to the other node's shard queues on that node's downlink behind the other worker's push there,
// and a shard's reply leaves on its node's uplink behind that node's worker's own push.
TEST(NetworkModel, EndpointsSharingALinkQueueOnItAndTalkAcrossNoLink) {
  const double S = 1e6, B = 1e6, lat = 0.01;
  NetworkModel net({B, B}, lat, false, {0, 1, 0, 1});
  // Worker 0 pushes to both shards at once: the local one arrives when handed over, the remote one
  // uses the uplink alone (the local bytes do not share it).
  const std::vector<double> a = net.send_batch(0, {2, 3}, {S, S}, 0.0);
  EXPECT_DOUBLE_EQ(a[0], 0.0);
  EXPECT_NEAR(a[1], 1.0 + lat, 1e-9);
  EXPECT_DOUBLE_EQ(net.sent(0), S) << "a message within one link counts on none";
  // Worker 1 pushes to shard 2 (on node 0) now: node 0's downlink is free, node 1's uplink too.
  EXPECT_NEAR(net.send(1, 2, S, 0.0), 1.0 + lat, 1e-9);
  // Shard 2 replies to worker 1 at 0.5 s: node 0's uplink is busy with worker 0's push until 1 s.
  EXPECT_NEAR(net.send(2, 1, S, 0.5), 2.0 + lat, 1e-9);
  EXPECT_DOUBLE_EQ(net.rate(2), B);
  // Without shared links the shard's reply would have left at once on a link of its own.
  NetworkModel own({B, B, B, B}, lat);
  own.send_batch(0, {2, 3}, {S, S}, 0.0);
  EXPECT_NEAR(own.send(2, 1, S, 0.5), 1.5 + lat, 1e-9);
  EXPECT_THROW(NetworkModel({B}, lat, false, {0, 1}), Error);  // an endpoint on a link that does not exist
}

TEST(NetworkModel, RingAllreduceIsAlphaBeta) {
  EXPECT_EQ(ring_allreduce_s(1, 1e6, 1e9, 1e-4), 0.0);
  // 2(n-1) phases of bytes/n: the bandwidth term is 2(n-1)/n x S / B.
  EXPECT_NEAR(ring_allreduce_s(4, 4e6, 1e9, 0.0), 2.0 * 3 / 4 * 4e6 / 1e9, 1e-15);
  EXPECT_NEAR(ring_allreduce_s(8, 8e6, 1e9, 1e-5), 14 * (1e-5 + 1e6 / 1e9), 1e-15);
}

// The reference: a ring of 2 virtual workers with batch b makes, step by step, the losses of the
// plain single-process trainer with batch 2b (the sampler gives replica r of 2 the r-th half of
// the same global batch; the mean gradient is clipped and AdamW-stepped alike).
TEST(Simulator, RingOfTwoMatchesThePlainTrainerWithTheGlobalBatch) {
  test::TempDir d;
  SimJob j = sim_job(d, "ring", 2);
  j.run.train.batch_size = 2;
  j.run.dist.clip_scope = "job";
  run_simulation(j.run, j.ps, j.sim, d.str("sim"), false);

  RunConfig single = test::tiny_run_config(d);
  single.train.batch_size = 4;
  Trainer t(single, d.str("single"), false, "", false);
  t.run();
  const auto a = steps_of(d.str("sim/node0/metrics.jsonl")), b = steps_of(d.str("single/metrics.jsonl"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 2e-5) << "step " << i + 1;
    EXPECT_NEAR(a[i]["lr"].get<double>(), b[i]["lr"].get<double>(), 1e-15);
    EXPECT_EQ(a[i]["tokens"], b[i]["tokens"]);  // the ring's steps count every worker's tokens
  }
  // Both workers log the same averaged loss.
  EXPECT_EQ(steps_of(d.str("sim/node1/metrics.jsonl")).back()["loss"], a.back()["loss"]);
}

// The shards' path: BSP parameter servers apply the mean of the node-clipped gradients with the
// shards' AdamW, which is the ring with clip_scope=node, element for element.
TEST(Simulator, BspShardsMatchTheRingWithNodeClipping) {
  test::TempDir d;
  SimJob ring = sim_job(d, "ring", 3);
  ring.run.dist.clip_scope = "node";
  ring.run.optim.grad_clip = 0.5;  // binding: the clip matters
  run_simulation(ring.run, ring.ps, ring.sim, d.str("ring"), false);
  SimJob bsp = sim_job(d, "ps", 3);
  bsp.run.optim.grad_clip = 0.5;
  bsp.ps.consistency = "bsp";
  bsp.sim.servers = 2;
  run_simulation(bsp.run, bsp.ps, bsp.sim, d.str("bsp"), false);
  // The ring logs the workers' mean loss, a ps worker its own: the means must agree.
  for (size_t i = 0; i < 6; ++i) {
    double mean = 0;
    for (int r = 0; r < 3; ++r) mean += steps_of(d.str("bsp/node" + std::to_string(r) + "/metrics.jsonl"))[i]["loss"].get<double>();
    EXPECT_NEAR(mean / 3, steps_of(d.str("ring/node0/metrics.jsonl"))[i]["loss"].get<double>(), 2e-5) << "step " << i + 1;
  }
  const auto v_ring = test::read_jsonl(d.str("ring/node0/metrics.jsonl")), v_bsp = test::read_jsonl(d.str("bsp/node0/metrics.jsonl"));
  EXPECT_NEAR(v_ring.back()["val_loss"].get<double>(), v_bsp.back()["val_loss"].get<double>(), 2e-5);
  // BSP: every update fresh; the shards' statistics are where the scripts read them.
  for (const auto& m : steps_of(d.str("bsp/node1/metrics.jsonl"))) EXPECT_EQ(m["staleness"].get<double>(), 0.0);
  const std::string log = slurp(d.str("bsp/logs/server1.log"));
  ASSERT_NE(log.find("[server 1] stats {"), std::string::npos) << log;
  const auto stats = nlohmann::json::parse(log.substr(log.find('{')));
  EXPECT_EQ(stats["updates"].get<int64_t>(), 6);  // one per clock
}

// Closed-form times: a ring step is the slowest modelled compute plus the alpha-beta all-reduce;
// BSP through one shard whose link is the workers' is compute + W pushes queued into the shard
// + W replies queued out of it.
TEST(Simulator, StepTimesFollowTheComputeAndLinkModels) {
  test::TempDir d;
  SimJob ring = sim_job(d, "ring", 4);
  ring.sim.link_gbit = 0.1;
  run_simulation(ring.run, ring.ps, ring.sim, d.str("ring"), false);
  const auto p = nlohmann::json::parse(slurp(d.str("ring/sim.json")))["params"].get<double>();
  const double B = 0.1e9 / 8, lat = 50e-6;
  const double ring_s = ring_allreduce_s(4, 4 * p, B, lat);
  for (const auto& m : steps_of(d.str("ring/node2/metrics.jsonl")))
    EXPECT_NEAR(m["step_s"].get<double>(), 0.1 + ring_s, 1e-9);

  SimJob bsp = sim_job(d, "ps", 4);
  bsp.sim.link_gbit = 0.1;
  bsp.sim.servers = 1;
  bsp.ps.consistency = "bsp";
  run_simulation(bsp.run, bsp.ps, bsp.sim, d.str("bsp"), false);
  const double msg = 4 * p + 128;  // the shard's whole range and a header
  // The last push lands after 4 transfers through the shard's downlink; the last reply leaves
  // after 4 through its uplink.
  const double expected = 0.1 + (lat + 4 * msg / B) + (lat + 4 * msg / B);
  double slowest = 0;
  for (int r = 0; r < 4; ++r) slowest = std::max(slowest, steps_of(d.str("bsp/node" + std::to_string(r) + "/metrics.jsonl"))[0]["step_s"].get<double>());
  EXPECT_NEAR(slowest, expected, 1e-9);

  // The shard on node 0, sharing its link (sim.colocate_servers): worker 0's push and reply cross no
  // link, so 3 transfers each way instead of 4.
  bsp.sim.colocate_servers = true;
  run_simulation(bsp.run, bsp.ps, bsp.sim, d.str("bsp_colocated"), false);
  slowest = 0;
  for (int r = 0; r < 4; ++r)
    slowest = std::max(slowest, steps_of(d.str("bsp_colocated/node" + std::to_string(r) + "/metrics.jsonl"))[0]["step_s"].get<double>());
  EXPECT_NEAR(slowest, 0.1 + (lat + 3 * msg / B) + (lat + 3 * msg / B), 1e-9);

  // A measured goodput (sim.ps_goodput and sim.ring_goodput, what experiments/advise.py takes from a
  // probe's rounds): every transfer of that mode's exchange at that share of the rate, the latency
  // unchanged; the other mode's goodput changes nothing.
  bsp.sim.colocate_servers = false;
  bsp.sim.ps_goodput = 0.5;
  run_simulation(bsp.run, bsp.ps, bsp.sim, d.str("bsp_goodput"), false);
  slowest = 0;
  for (int r = 0; r < 4; ++r)
    slowest = std::max(slowest, steps_of(d.str("bsp_goodput/node" + std::to_string(r) + "/metrics.jsonl"))[0]["step_s"].get<double>());
  EXPECT_NEAR(slowest, 0.1 + 2 * (lat + 4 * msg / (0.5 * B)), 1e-9);
  bsp.sim.ring_goodput = 4;
  run_simulation(bsp.run, bsp.ps, bsp.sim, d.str("bsp_goodput_ring"), false);
  EXPECT_NEAR(steps_of(d.str("bsp_goodput_ring/node3/metrics.jsonl"))[0]["step_s"].get<double>(),
              steps_of(d.str("bsp_goodput/node3/metrics.jsonl"))[0]["step_s"].get<double>(), 1e-12);
  ring.sim.ps_goodput = 0.5;
  run_simulation(ring.run, ring.ps, ring.sim, d.str("ring_ps_goodput"), false);
  for (const auto& m : steps_of(d.str("ring_ps_goodput/node2/metrics.jsonl")))
    EXPECT_NEAR(m["step_s"].get<double>(), 0.1 + ring_s, 1e-9);
  ring.sim.ring_goodput = 2;
  run_simulation(ring.run, ring.ps, ring.sim, d.str("ring_goodput"), false);
  for (const auto& m : steps_of(d.str("ring_goodput/node2/metrics.jsonl")))
    EXPECT_NEAR(m["step_s"].get<double>(), 0.1 + ring_allreduce_s(4, 4 * p, 2 * B, lat), 1e-9);
}

// sim.worker_slowdowns (the advisor's replay of every probed node's speed): worker r's modelled step is
// its factor x emulate.step_time_s, each worker its own; "1,1,1,3" is exactly sim.slow_workers=3 with
// emulate.slowdown=3, the jitter's draws included.
TEST(Simulator, WorkerSlowdownsGiveEachWorkerItsOwnStep) {
  test::TempDir d;
  SimJob j = sim_job(d, "ps", 4);
  j.ps.consistency = "asp";
  j.sim.worker_slowdowns = "1,1.2,0.9,1.4";
  run_simulation(j.run, j.ps, j.sim, d.str("each"), false);
  const double factor[] = {1, 1.2, 0.9, 1.4};
  for (int r = 0; r < 4; ++r)
    for (const auto& m : steps_of(d.str("each/node" + std::to_string(r) + "/metrics.jsonl")))
      EXPECT_NEAR(m["modelled_s"].get<double>(), 0.1 * factor[r], 1e-12) << r;

  j.run.emulate.jitter = 0.3;
  j.sim.worker_slowdowns = "1,1,1,3";
  run_simulation(j.run, j.ps, j.sim, d.str("list"), false);
  SimJob k = j;
  k.sim.worker_slowdowns = "";
  k.sim.slow_workers = "3";
  k.run.emulate.slowdown = 3;
  run_simulation(k.run, k.ps, k.sim, d.str("one_factor"), false);
  for (int r = 0; r < 4; ++r) {
    const std::string f = "/node" + std::to_string(r) + "/metrics.jsonl";
    EXPECT_EQ(slurp(d.str("list") + f), slurp(d.str("one_factor") + f)) << f;
  }
}

// sim.spread_start_s (the advisor's replay of syncopate-probe's spread rounds): worker r begins r / N of
// it after the others, so under ASP the pushes reach the shard one after another. Spread by more than a
// round trip, none queues behind another: every worker's first step is compute + push + reply, ending
// r / N x spread_start_s later than worker 0's; together (0, the default), the last push waits behind
// the other three at the shard's downlink.
TEST(Simulator, SpreadStartsPushesOneAfterAnother) {
  test::TempDir d;
  SimJob j = sim_job(d, "ps", 4);
  j.ps.consistency = "asp";
  j.sim.link_gbit = 0.1;
  j.sim.servers = 1;
  j.run.train.steps = 2;
  run_simulation(j.run, j.ps, j.sim, d.str("together"), false);
  const auto p = nlohmann::json::parse(slurp(d.str("together/sim.json")))["params"].get<double>();
  const double B = 0.1e9 / 8, lat = 50e-6, msg = 4 * p + 128;
  const double alone = 0.1 + 2 * (lat + msg / B);  // compute, the push, the reply: nothing queued
  double latest = 0;
  for (int r = 0; r < 4; ++r)
    latest = std::max(latest, steps_of(d.str("together/node" + std::to_string(r) + "/metrics.jsonl"))[0]["time_s"].get<double>());
  EXPECT_GT(latest, alone + 2 * msg / B);  // queued behind at least two others' pushes
  const double spread = 8 * (lat + msg / B);  // a quarter of it (2 transfers) apart: more than one round trip
  j.sim.spread_start_s = spread;
  run_simulation(j.run, j.ps, j.sim, d.str("spread"), false);
  for (int r = 0; r < 4; ++r) {
    const auto first = steps_of(d.str("spread/node" + std::to_string(r) + "/metrics.jsonl"))[0];
    EXPECT_NEAR(first["step_s"].get<double>(), alone, 1e-9) << "worker " << r;
    EXPECT_NEAR(first["time_s"].get<double>(), spread * r / 4 + alone, 1e-9) << "worker " << r;
  }
}

// emulate.overlap with the ring (dist.overlap, the job's clipping scope): the buckets the trainer
// makes, each all-reduced once every worker's modelled backward has produced it and the previous
// bucket's ring is done. Checked against that rule written out here from bucket_bounds (no jitter:
// every worker starts together), and against the bounds it must respect: shorter than compute + the
// whole ring (the overlap saves time on a slow link), no shorter than compute + the last bucket's ring.
TEST(Simulator, RingOverlapAllReducesBucketsAsTheModelledBackwardProducesThem) {
  test::TempDir d;
  SimJob j = sim_job(d, "ring", 4);
  j.sim.link_gbit = 0.05;
  j.run.dist.clip_scope = "job";
  j.run.dist.overlap = true;
  j.run.dist.first_bucket_kb = 8;
  j.run.dist.bucket_kb = 32;
  j.run.emulate.overlap = true;
  run_simulation(j.run, j.ps, j.sim, d.str("ov"), false);

  GPT m(j.run.model);
  FlatParameters flat(*m);
  const std::vector<int64_t> b = bucket_bounds(parameter_ranges(flat), 8 * 1024 / 4, 32 * 1024 / 4);
  ASSERT_GE(b.size(), 4u) << "several buckets, or nothing overlaps";
  const double P = static_cast<double>(flat.numel()), B = 0.05e9 / 8, lat = 50e-6, T = 0.1, fs = 1.0 / 3;
  double end = 0;
  for (size_t k = b.size() - 1; k-- > 0;) {
    const double ready = T * (fs + (1 - fs) * (P - static_cast<double>(b[k])) / P);
    end = std::max(end, ready) + ring_allreduce_s(4, 4.0 * static_cast<double>(b[k + 1] - b[k]), B, lat);
  }
  const double expected = std::max(end, T);
  const double whole = T + ring_allreduce_s(4, 4 * P, B, lat);
  const double last = T + ring_allreduce_s(4, 4.0 * static_cast<double>(b[1] - b[0]), B, lat);
  ASSERT_LT(expected, whole);
  for (const auto& s : steps_of(d.str("ov/node1/metrics.jsonl"))) {
    EXPECT_NEAR(s["step_s"].get<double>(), expected, 1e-9);
    EXPECT_GE(s["step_s"].get<double>(), last - 1e-12);
  }
  // The same job without emulate.overlap: the whole ring after the compute.
  j.run.emulate.overlap = false;
  run_simulation(j.run, j.ps, j.sim, d.str("no"), false);
  for (const auto& s : steps_of(d.str("no/node1/metrics.jsonl"))) EXPECT_NEAR(s["step_s"].get<double>(), whole, 1e-9);
}

// dist.ps_partition_mb (BytePS's partitions), held as syncopate-server holds them (ShardPartitions):
// the same updates as whole shards (every rule is per element), and on a link that limits, a shorter
// step: the shard answers a partition as soon as it is in (BSP: every worker's copy of it) while the
// next ones still arrive, so push and pull overlap. One worker: whole = S/B in + S/B out; 8
// partitions = S/8B + S/B, 0.5625 of it. Two workers into one shard: the model's downlink takes
// simultaneous senders one after the other (not interleaved as TCP would), so worker 1's first
// partition lands after all of worker 0's: (S/B + S/8B + 2S/B) / (4S/B) = 0.78 of whole, a gain the
// model understates (docs/STUDY.md, the simulator's limits).
TEST(Simulator, PartitionsApplyTheSameUpdatesAndOverlapPushWithPull) {
  test::TempDir d;
  for (int workers : {1, 2}) {
    auto job = [&](double partition_mb) {
      SimJob j = sim_job(d, "ps", workers);
      j.ps.consistency = "bsp";
      j.sim.servers = 1;
      j.sim.link_gbit = 0.05;
      j.sim.latency_us = 0;
      j.run.dist.ps_partition_mb = partition_mb;
      return j;
    };
    const std::string w = "w" + std::to_string(workers);
    SimJob whole = job(0);
    run_simulation(whole.run, whole.ps, whole.sim, d.str(w + "whole"), false);
    const double p = nlohmann::json::parse(slurp(d.str(w + "whole/sim.json")))["params"].get<double>();
    SimJob parted = job(p * 4 / 8 / (1 << 20) * 1.0001);  // 8 partitions of the one shard
    run_simulation(parted.run, parted.ps, parted.sim, d.str(w + "parted"), false);
    const std::string log = slurp(d.str(w + "parted/logs/server0.log"));
    const auto stats = nlohmann::json::parse(log.substr(log.find('{')));
    EXPECT_EQ(stats["partitions"].get<int64_t>(), 8) << log;
    const double expect = workers == 1 ? 0.5625 : 0.78;
    for (int r = 0; r < workers; ++r) {
      const auto a = steps_of(d.str(w + "whole/node" + std::to_string(r) + "/metrics.jsonl"));
      const auto b = steps_of(d.str(w + "parted/node" + std::to_string(r) + "/metrics.jsonl"));
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << workers << " workers, step " << i + 1;
        const double comm_whole = a[i]["step_s"].get<double>() - 0.1, comm_parted = b[i]["step_s"].get<double>() - 0.1;
        EXPECT_NEAR(comm_parted / comm_whole, expect, 0.02) << workers << " workers, worker " << r << " step " << i + 1;
      }
    }
    const auto va = test::read_jsonl(d.str(w + "whole/node0/metrics.jsonl"));
    const auto vb = test::read_jsonl(d.str(w + "parted/node0/metrics.jsonl"));
    EXPECT_EQ(va.back()["val_loss"].get<double>(), vb.back()["val_loss"].get<double>());
  }
}

// dist.ps_push_in_backward with emulate.overlap (BytePS's overlap, as the trainer with the pacer's
// gate): each partition's push leaves when the modelled backward has produced it. The same updates
// as pushing after the compute (the gradient of the step start's parameters, no clipping: losses
// equal bit for bit), a shorter step on a slow link, and never shorter than the compute plus the last
// partition's push and reply (it leaves at the end of backward). Without emulate.overlap: refused.
TEST(Simulator, PsPushInBackwardSendsEachPartitionAsTheModelledBackwardProducesIt) {
  test::TempDir d;
  auto job = [&](bool in_backward) {
    SimJob j = sim_job(d, "ps", 1);
    j.ps.consistency = "bsp";
    j.sim.servers = 1;
    j.sim.link_gbit = 0.05;
    j.sim.latency_us = 0;
    j.run.optim.grad_clip = 0;
    j.run.dist.ps_push_in_backward = in_backward;
    j.run.emulate.overlap = in_backward;
    return j;
  };
  SimJob after = job(false);
  run_simulation(after.run, after.ps, after.sim, d.str("after"), false);
  const double p = nlohmann::json::parse(slurp(d.str("after/sim.json")))["params"].get<double>();
  SimJob during = job(true), parted_after = job(false);
  during.run.dist.ps_partition_mb = parted_after.run.dist.ps_partition_mb = p * 4 / 8 / (1 << 20) * 1.0001;  // 8 partitions
  run_simulation(during.run, during.ps, during.sim, d.str("during"), false);
  run_simulation(parted_after.run, parted_after.ps, parted_after.sim, d.str("parted_after"), false);
  const auto a = steps_of(d.str("parted_after/node0/metrics.jsonl"));
  const auto b = steps_of(d.str("during/node0/metrics.jsonl"));
  ASSERT_EQ(a.size(), b.size());
  const double B = 0.05e9 / 8, last_part = (4 * p / 8 + 128) / B;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_LT(b[i]["step_s"].get<double>(), a[i]["step_s"].get<double>() - 1e-3) << "step " << i + 1;
    EXPECT_GE(b[i]["step_s"].get<double>(), 0.1 + 2 * last_part * 0.999) << "step " << i + 1;
  }
  SimJob bad = job(true);
  bad.run.emulate.overlap = false;
  try {
    validate_simulation(bad.run, bad.ps, bad.sim);
    ADD_FAILURE() << "ps_push_in_backward without emulate.overlap was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("emulate.overlap"), std::string::npos) << e.what();
  }
}

// The same config gives the same files, byte for byte; asynchrony with a straggler shows staleness.
TEST(Simulator, IsDeterministicAndMeasuresStaleness) {
  test::TempDir d;
  SimJob j = sim_job(d, "ps", 4);
  j.ps.consistency = "asp";
  j.run.emulate.jitter = 0.3;
  j.run.emulate.slowdown = 3;
  j.sim.slow_workers = "3";
  j.sim.slow_steps = 2;
  j.sim.servers = 2;
  run_simulation(j.run, j.ps, j.sim, d.str("a"), false);
  run_simulation(j.run, j.ps, j.sim, d.str("b"), false);
  for (int r = 0; r < 4; ++r) {
    const std::string f = "/node" + std::to_string(r) + "/metrics.jsonl";
    EXPECT_EQ(slurp(d.str("a") + f), slurp(d.str("b") + f)) << f;
  }
  EXPECT_EQ(slurp(d.str("a/logs/server0.log")), slurp(d.str("b/logs/server0.log")));
  EXPECT_EQ(steps_of(d.str("a/node3/metrics.jsonl")).size(), 2u);  // the straggler's elastic budget
  EXPECT_EQ(steps_of(d.str("a/node0/metrics.jsonl")).size(), 6u);
  double max_stale = 0;
  for (int r = 0; r < 4; ++r)
    for (const auto& m : steps_of(d.str("a/node" + std::to_string(r) + "/metrics.jsonl")))
      max_stale = std::max(max_stale, m["staleness"].get<double>());
  EXPECT_GE(max_stale, 2.0);  // three other workers' updates land between a read and its push
  const auto stats = nlohmann::json::parse(slurp(d.str("a/logs/server0.log")).substr(slurp(d.str("a/logs/server0.log")).find('{')));
  EXPECT_EQ(stats["updates"].get<int64_t>(), 3 * 6 + 2);  // ASP: every push applied
}

// As the trainer (issue 25): mid-run, a ps worker scores what the shards last replied to it; at the
// job's end worker 0 scores the shards' values once every worker is done (job_final), here after the
// straggler's last update, at the simulation's end; not the shards' values when worker 0 finished.
TEST(Simulator, PsFinalEvaluationWaitsForEveryWorkerAsTheTrainer) {
  test::TempDir d;
  SimJob j = sim_job(d, "ps", 3);
  j.ps.consistency = "asp";
  j.run.emulate.slowdown = 4;
  j.sim.slow_workers = "2";
  j.run.eval.every_tokens = 256;  // 2 worker-steps of 128 tokens
  run_simulation(j.run, j.ps, j.sim, d.str("a"), false);
  std::vector<nlohmann::json> evals;
  for (auto& m : test::read_jsonl(d.str("a/node0/metrics.jsonl")))
    if (m.contains("val_loss")) evals.push_back(m);
  ASSERT_GE(evals.size(), 2u);
  for (size_t i = 0; i + 1 < evals.size(); ++i) EXPECT_FALSE(evals[i].contains("job_final")) << evals[i].dump();
  const auto& last = evals.back();
  EXPECT_TRUE(last.value("job_final", false)) << last.dump();
  EXPECT_EQ(last["eval_of"], "servers");
  const auto sim = nlohmann::json::parse(slurp(d.str("a/sim.json")));
  EXPECT_DOUBLE_EQ(last["time_s"].get<double>(), sim["simulated_s"].get<double>());
  const double w0_end = steps_of(d.str("a/node0/metrics.jsonl")).back()["time_s"].get<double>();
  const double straggler_end = steps_of(d.str("a/node2/metrics.jsonl")).back()["time_s"].get<double>();
  EXPECT_LT(w0_end, straggler_end);  // the test is about something: worker 0 ends first
  EXPECT_GE(last["time_s"].get<double>(), straggler_end);
  // While worker 0 waits, the points the shards' count passes are scored on their values, as the
  // trainer's while_waiting records (PsTraining.NodeZeroEvaluatesTheServersWhileItWaitsForAStraggler).
  int waiting = 0;
  for (const auto& m : evals)
    if (m.value("while_waiting", false)) {
      ++waiting;
      EXPECT_GT(m["time_s"].get<double>(), w0_end);
      EXPECT_LT(m["global_tokens"].get<int64_t>(), 3 * 6 * 128) << m.dump();
    }
  EXPECT_GE(waiting, 1) << slurp(d.str("a/node0/metrics.jsonl"));
}

// Protocol 9 in the simulator, as PsTraining.ANodeBehindTheBspRoundsEndsWhenTheyReachTheBudget: under
// BSP with a backup worker a worker 8x slower than the others ends when the rounds reach its budget,
// instead of running its steps left (each then a round of its own); the shards apply the job's steps.
TEST(Simulator, ABspWorkerBehindTheRoundsEndsWhenTheyReachTheBudget) {
  test::TempDir d;
  SimJob j = sim_job(d, "ps", 3);
  j.ps.consistency = "bsp";
  j.ps.backup_workers = 1;
  j.run.train.steps = 12;
  j.run.emulate.slowdown = 8;
  j.sim.slow_workers = "2";
  run_simulation(j.run, j.ps, j.sim, d.str("a"), false);
  const auto slow = steps_of(d.str("a/node2/metrics.jsonl"));
  ASSERT_FALSE(slow.empty());
  EXPECT_LE(slow.back()["step"].get<int64_t>(), 3) << slurp(d.str("a/node2/metrics.jsonl"));
  EXPECT_EQ(steps_of(d.str("a/node0/metrics.jsonl")).back()["step"], 12);
  const auto sim = nlohmann::json::parse(slurp(d.str("a/sim.json")));
  // The job ends with the fast workers' 12 steps of 0.1 s, not the slow one's 12 of 0.8 s.
  EXPECT_LT(sim["simulated_s"].get<double>(), 12 * 0.8 / 2) << sim.dump();
}

// Local SGD / DiLoCo: synchronous through the ring, asynchronous through the shards' outer step.
TEST(Simulator, LocalSgdSyncsEveryHStepsInTheRingAndAtTheShards) {
  test::TempDir d;
  SimJob ring = sim_job(d, "ring", 2);
  ring.run.dist.sync_every = 3;
  ring.run.dist.outer = "nesterov";
  run_simulation(ring.run, ring.ps, ring.sim, d.str("ring"), false);
  const auto r0 = steps_of(d.str("ring/node0/metrics.jsonl"));
  ASSERT_EQ(r0.size(), 6u);
  EXPECT_EQ(r0[0]["wire_bytes"].get<double>(), 0.0);  // inner steps send nothing
  EXPECT_GT(r0[2]["wire_bytes"].get<double>(), 0.0);  // the round's all-reduce
  EXPECT_GT(r0[2]["step_s"].get<double>(), r0[1]["step_s"].get<double>());

  SimJob ps = sim_job(d, "ps", 2);
  ps.run.dist.sync_every = 3;
  ps.run.dist.outer = "delayed_nesterov";
  ps.ps.consistency = "asp";
  run_simulation(ps.run, ps.ps, ps.sim, d.str("ps"), false);
  const auto stats = nlohmann::json::parse(slurp(d.str("ps/logs/server0.log")).substr(slurp(d.str("ps/logs/server0.log")).find('{')));
  EXPECT_EQ(stats["updates"].get<int64_t>(), 2 * 2);  // two rounds of two workers
  const auto p0 = steps_of(d.str("ps/node0/metrics.jsonl"));
  EXPECT_EQ(p0[1]["wire_bytes"].get<double>(), 0.0);
  EXPECT_GT(p0[5]["wire_bytes"].get<double>(), 0.0);
}

TEST(Simulator, RefusesBadInputByName) {
  test::TempDir d;
  auto err = [&](SimJob j) { return test::error_of([&] { validate_simulation(j.run, j.ps, j.sim); }); };
  SimJob ok = sim_job(d, "ps", 4);
  EXPECT_EQ(err(ok), "");
  SimJob j = ok;
  j.run.dist.mode = "none";
  EXPECT_NE(err(j).find("dist.mode=none"), std::string::npos);
  j = ok;
  j.run.emulate.step_time_s = 0;
  EXPECT_NE(err(j).find("modelled step time"), std::string::npos);
  j = ok;
  j.sim.slow_workers = "4";
  EXPECT_NE(err(j).find("sim.slow_workers entry '4'"), std::string::npos);
  j = ok;
  j.sim.slow_workers = "x";
  EXPECT_NE(err(j).find("sim.slow_workers"), std::string::npos);
  j = ok;
  j.ps.consistency = "bsp";
  j.ps.backup_workers = 4;
  EXPECT_NE(err(j).find("backup"), std::string::npos);
  j = ok;
  j.run.dist.mode = "ring";
  j.sim.slow_steps = 2;
  EXPECT_NE(err(j).find("sim.slow_steps with a ring"), std::string::npos);
  j = ok;
  j.sim.worker_slowdowns = "1,1,2";
  EXPECT_NE(err(j).find("3 factor(s) for sim.workers=4"), std::string::npos) << err(j);
  j.sim.worker_slowdowns = "1,1,x,1";
  EXPECT_NE(err(j).find("sim.worker_slowdowns entry 2 'x'"), std::string::npos) << err(j);
  j.sim.worker_slowdowns = "1,1,0,1";
  EXPECT_NE(err(j).find("entry 2 '0'"), std::string::npos) << err(j);
  j.sim.worker_slowdowns = "1,1,1,2";
  EXPECT_EQ(err(j), "");
  j.sim.slow_workers = "3";
  EXPECT_NE(err(j).find("not both"), std::string::npos) << err(j);
  j.sim.slow_workers = "";
  j.run.emulate.slowdown = 2;
  EXPECT_NE(err(j).find("leave emulate.slowdown at 1"), std::string::npos) << err(j);
  j = ok;
  j.run.dist.wire = "bf16";
  EXPECT_NE(err(j).find("dist.wire=bf16"), std::string::npos);
  j = ok;
  j.sim.colocate_servers = true;
  j.sim.server_link_gbit = 10;
  EXPECT_NE(err(j).find("sim.colocate_servers"), std::string::npos);
  j = ok;  // more partitions per server than syncopate-server holds (one value each)
  j.run.dist.ps_partition_mb = 1e-7;
  EXPECT_NE(err(j).find("dist.ps_partition_mb"), std::string::npos);
  j.run.dist.ps_partition_mb = 4;
  EXPECT_EQ(err(j), "");
  j = ok;  // memory: refused before it starts, with the estimate
  j.sim.workers = 4096;
  j.run.model.preset = "small";
  j.run.model = gpt_preset("small");
  j.sim.memory_gb = 1;
  const std::string m = err(j);
  EXPECT_NE(m.find("needs about"), std::string::npos) << m;
  EXPECT_NE(m.find("GiB"), std::string::npos) << m;
  // The range checks of the config schema: 0 workers, a negative link.
  ConfigSchema s;
  SimConfig sc;
  s.section("sim", sc);
  EXPECT_NE(test::error_of([&] { s.apply_override("sim.workers", "0"); }), "");
  EXPECT_NE(test::error_of([&] { s.apply_override("sim.link_gbit", "-1"); }), "");
  EXPECT_NE(test::error_of([&] { s.apply_override("sim.workers", "5000"); }), "");
}

// The binary: a run from flags, its files, and a config error's exit code.
TEST(Simulator, BinaryRunsFromFlags) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::string bin = std::string(SYNCOPATE_BIN_DIR) + "/syncopate-sim";
  auto r = test::run_command(bin + " --out " + d.str("out") + " --quiet --sim.workers=3 --model.n_embd=32 --model.n_head=2" +
                             " --model.block_size=32 --train.steps=4 --train.batch_size=2 --data.corpus=" + corpus +
                             " --data.cache_dir=" + d.str("cache") + " --schedule.warmup_steps=1 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(fs::exists(d.str("out/node" + std::to_string(k) + "/metrics.jsonl")));
  EXPECT_TRUE(fs::exists(d.str("out/logs/server2.log")));
  const auto sim = nlohmann::json::parse(slurp(d.str("out/sim.json")));
  EXPECT_EQ(sim["worker_steps"].get<int64_t>(), 12);
  EXPECT_GT(sim["simulated_s"].get<double>(), 4 * 0.3);
  EXPECT_TRUE(fs::exists(d.str("out/config.toml")));
  // Without --quiet the run ends with its one-screen summary (issue 32), numbers from sim.json.
  r = test::run_command(bin + " --out " + d.str("out2") + " --sim.workers=3 --model.n_embd=32 --model.n_head=2" +
                        " --model.block_size=32 --train.steps=4 --train.batch_size=2 --data.corpus=" + corpus +
                        " --data.cache_dir=" + d.str("cache") + " --schedule.warmup_steps=1 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[sim] summary of " + d.str("out2") + " (times are simulated seconds)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("3 workers, ps asp through 3 shard(s): 12 worker-steps, 768 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("final validation loss (worker 0, servers weights): "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(d.str("out2") + "/node<r>/metrics.jsonl"), std::string::npos) << r.output;
  r = test::run_command(bin + " --sim.workers=0 2>&1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("sim.workers"), std::string::npos) << r.output;
}

// sim.time_schedule: the learning rate follows the simulated clock to the budget, whatever the step
// times (heavy-tailed jitter here), every configuration's shipped weights are scored at exactly the
// budget, and train.steps only caps the run: in every mode the studies compare (the ring, BSP with a
// backup worker, SSP, ASP, DiLoCo through the ring, async local SGD through the shards).
TEST(Simulator, TimeScheduleEndsEveryRunAtTheBudget) {
  struct Case {
    std::string name, mode, consistency;
    int64_t backup = 0, sync_every = 1;
    std::string outer = "nesterov", eval_of = "servers";
  };
  const std::vector<Case> cases = {{"ring", "ring", "", 0, 1, "nesterov", "replica"},
                                   {"bsp_backup", "ps", "bsp", 1},
                                   {"ssp", "ps", "ssp"},
                                   {"asp", "ps", "asp"},
                                   {"diloco", "ring", "", 0, 3, "nesterov", "outer"},
                                   {"async_local_sgd", "ps", "asp", 0, 3, "delayed_nesterov"}};
  for (const Case& c : cases) {
    test::TempDir d;
    SimJob j = sim_job(d, c.mode, 4);
    j.run.train.steps = 399;  // a cap far past what the budget holds (whole rounds of 3)
    j.run.emulate.jitter = 0.3;
    j.run.emulate.jitter_tail = 1.5;
    j.run.schedule.warmup_frac = 0.1;
    j.run.schedule.min_lr = 1e-5;
    j.run.optim.lr = 1e-3;
    j.run.dist.sync_every = c.sync_every;
    j.run.dist.outer = c.outer;
    if (c.mode == "ps") j.ps.consistency = c.consistency, j.ps.backup_workers = c.backup;
    j.sim.servers = 2;
    j.sim.time_limit_s = 3.0;
    j.sim.time_schedule = true;
    const SimResult r = run_simulation(j.run, j.ps, j.sim, d.str("out"), false);
    EXPECT_EQ(r.ended_by, "time_limit") << c.name;
    const double limit = j.sim.time_limit_s;
    for (int w = 0; w < 4; ++w) {
      const auto steps = steps_of(d.str(fmt::format("out/node{}/metrics.jsonl", w)));
      ASSERT_GT(steps.size(), 5u) << c.name << " worker " << w;
      EXPECT_LT(steps.size(), 399u) << c.name;  // the budget ended it, not the cap
      for (const auto& m : steps) {
        const double began = m["time_s"].get<double>() - m["step_s"].get<double>();
        EXPECT_LE(m["time_s"].get<double>(), limit) << c.name;
        EXPECT_NEAR(m["lr"].get<double>(), lr_at_progress(j.run.schedule, 1e-3, began / limit), 1e-12)
            << c.name << " step " << m["step"];
      }
      // The last step began in the schedule's second half (by steps, a run whose steps took longer than
      // planned would still be near its peak rate here).
      EXPECT_LT(steps.back()["lr"].get<double>(), lr_at_progress(j.run.schedule, 1e-3, 0.5)) << c.name << " worker " << w;
    }
    std::vector<nlohmann::json> at_limit;
    for (auto& m : test::read_jsonl(d.str("out/node0/metrics.jsonl")))
      if (m.contains("at_limit")) at_limit.push_back(m);
    ASSERT_EQ(at_limit.size(), 1u) << c.name;
    EXPECT_DOUBLE_EQ(at_limit[0]["time_s"].get<double>(), limit);
    EXPECT_EQ(at_limit[0]["eval_of"], c.eval_of) << c.name;
    EXPECT_TRUE(std::isfinite(at_limit[0]["val_loss"].get<double>()));
    EXPECT_EQ(nlohmann::json::parse(slurp(d.str("out/sim.json")))["ended_by"], "time_limit");
  }
  // A cap the budget does not reach: the steps end the run, with no score at the budget (the studies list it).
  test::TempDir d;
  SimJob j = sim_job(d, "ring", 2);
  j.run.schedule.warmup_frac = 0.1;
  j.sim.time_limit_s = 100;
  j.sim.time_schedule = true;
  const SimResult capped = run_simulation(j.run, j.ps, j.sim, d.str("capped"), false);
  EXPECT_EQ(capped.ended_by, "steps");
  for (auto& m : test::read_jsonl(d.str("capped/node0/metrics.jsonl"))) EXPECT_FALSE(m.contains("at_limit"));
  j.sim.time_limit_s = 0;
  EXPECT_NE(test::error_of([&] { run_simulation(j.run, j.ps, j.sim, d.str("a"), false); }).find("sim.time_limit_s"),
            std::string::npos);
  j.sim.time_limit_s = 1;
  j.run.schedule.warmup_frac = 0;
  EXPECT_NE(test::error_of([&] { run_simulation(j.run, j.ps, j.sim, d.str("b"), false); }).find("schedule.warmup_frac"),
            std::string::npos);
}

// sim.target_loss: the run ends when worker 0's validation loss reaches it, and says when.
TEST(Simulator, StopsAtTheTargetLoss) {
  test::TempDir d;
  SimJob j = sim_job(d, "ring", 2);
  j.sim.target_loss = 100;  // met at the first evaluation (step 3)
  const SimResult r = run_simulation(j.run, j.ps, j.sim, d.str("out"), false);
  EXPECT_EQ(steps_of(d.str("out/node0/metrics.jsonl")).size(), 3u);
  const auto sim = nlohmann::json::parse(slurp(d.str("out/sim.json")));
  EXPECT_DOUBLE_EQ(sim["target_reached_s"].get<double>(), r.target_s);
  EXPECT_NEAR(r.target_s, steps_of(d.str("out/node0/metrics.jsonl")).back()["time_s"].get<double>(), 1e-12);
  j.sim.target_loss = 0.01;  // never met: every step runs, target_reached_s = -1
  const SimResult all = run_simulation(j.run, j.ps, j.sim, d.str("all"), false);
  EXPECT_EQ(all.target_s, -1);
  EXPECT_EQ(steps_of(d.str("all/node1/metrics.jsonl")).size(), 6u);
  j.sim.target_loss = 0;
  j.sim.time_limit_s = 0.25;  // two steps of 0.1 s (+ the all-reduce) fit, the third does not
  run_simulation(j.run, j.ps, j.sim, d.str("limit"), false);
  EXPECT_EQ(steps_of(d.str("limit/node0/metrics.jsonl")).size(), 2u);
}
