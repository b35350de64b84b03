// The virtual cluster's own knobs ([sim]): how many workers, what links join them, who straggles,
// how much memory the run may take. Everything else (model, data, optimizer, schedule,
// evaluation, mode, consistency, modelled compute) is the workers' and servers' own config
// (RunConfig + PsConfig), so a scenario means the same in the simulator as on the emulated cluster.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace syncopate {

struct SimConfig {
  int64_t workers = 4;           // virtual workers (nodes of one replica each), 1..4096
  int64_t servers = 0;           // ps: parameter-server shards, each an endpoint with its own link; 0 = one per
                                 // worker, capped at 16 (see docs/STUDY.md: K x B_server >= W x B decides)
  double link_gbit = 10;         // every worker's link rate, Gbit/s, each direction (full duplex)
  double server_link_gbit = 0;   // every server's link rate, Gbit/s; 0 = link_gbit
  bool colocate_servers = false; // ps: shard k runs on worker k mod N's node and shares its link (scripts/local_cluster.sh
                                 // --netns and launch_node.sh place them so): their messages queue on one uplink and one
                                 // downlink, and a worker's push to the shard on its own node crosses no link. false =
                                 // every shard on a host of its own with a server_link_gbit link
  double ps_goodput = 1;         // ps: the share of the link rate that parameter-server messages get, e.g. what a probe's
                                 // BSP round trips of the model's size achieved (experiments/advise.py measures it: incast
                                 // losses and TCP retransmissions make it < 1, a rate limiter's burst after a step's
                                 // compute > 1). Every link serves ps messages at ps_goodput x its rate; bytes are
                                 // counted as sent. 1 = the rate
  double ring_goodput = 1;       // ring: the same for the ring's all-reduce (a probe's ring rounds of the model's size)
  double latency_us = 50;        // one-way latency of every message (and of every ring hop), microseconds
  std::string sharing = "fair";  // messages a sender hands over together (a worker's pushes to its shards, a shard's
                                 // released replies): "fair" = they share its uplink and all leave when the last byte
                                 // has (TCP flows on a fair-queueing NIC); "fifo" = served one after the other (one
                                 // FIFO queue that holds them all, as a tbf qdisc whose rate x 50 ms exceeds them)
  std::string slow_workers;      // comma-separated indices of workers whose modelled step is emulate.slowdown x
                                 // longer (e.g. "7" or "0,5"); empty = none
  double slow_share = 0;         // also slow: the highest-numbered ceil(slow_share x workers) workers; 0 = none
  std::string worker_slowdowns;  // one factor per worker, comma-separated (e.g. "1,1,1.02,1.37"): worker r's modelled
                                 // step is its factor x emulate.step_time_s (a probe's measured node speeds, each
                                 // node as it is, rather than one factor for the stragglers); empty = none. Excludes
                                 // sim.slow_workers, sim.slow_share and emulate.slowdown
  int64_t slow_steps = 0;        // > 0: the slow workers stop after this many steps (the others run train.steps;
                                 // an "elastic" budget, as scripts/local_cluster.sh --slow-steps)
  int64_t eval_workers = 1;      // workers 0..eval_workers-1 evaluate (validation loss) at eval.every; the rest
                                 // only log training steps (evaluation costs real time, not simulated time)
  double memory_gb = 0;          // refuse a run whose estimated memory exceeds this, GiB; 0 = 80% of MemAvailable
  double target_loss = 0;        // > 0: the run ends once worker 0's validation loss is at or below this (time to
                                 // target in sim.json; studies stop paying for gradients past it); 0 = run every step
  double time_limit_s = 0;       // > 0: the run ends when the simulated clock passes this, seconds; 0 = no limit
  bool time_schedule = false;    // the learning-rate schedule runs by the simulated clock, not by train.steps: warmup
                                 // over schedule.warmup_frac of sim.time_limit_s, cosine decay to schedule.min_lr at
                                 // the limit (each step's rate from the moment it began), so that every run's schedule
                                 // ends at an equal wall budget however its step times fall; the job's shipped weights
                                 // are scored at exactly the limit. train.steps only caps the steps. Off = by steps
  bool flush_denormal = false;   // flush denormal floats to zero (x86 FTZ/DAZ). Many small asynchronous updates take
                                 // the model where softmax tails underflow into denormals, which made gradients ~1.8x
                                 // slower (docs/PERFORMANCE.md); flushing them is faster but no longer bit for bit
                                 // what the workers (which do not flush) compute
  std::string churn;             // membership events of an elastic parameter-server job (dist.mode=ps, dist.elastic):
                                 // "kill9@T:W:D,sigterm@T:W:D,join@T:W", T and D seconds, W a worker id
                                 // (experiments/sim/churn_schedule.h); empty = none
  double start_s = 0;            // modelled seconds from a worker process's launch to its first step (start-up, INIT and
                                 // join round trips; experiments/churn.py measures it on the emulated cluster): every
                                 // worker launches at 0 (a restarted or joining one: sim.restart_s after its launch);
                                 // 0 = none (the first workers step at once)
  double spread_start_s = 0;     // worker r's first step begins r / workers x this many seconds after sim.start_s, so
                                 // that their pushes arrive spread out (the advisor's replay of syncopate-probe's spread
                                 // rounds); 0 = every worker begins together
  double restart_s = 0;          // churn: the same for a restarted or joining worker (its INIT join round trips against a
                                 // running job); 0 = start_s
  double exit_s = 0;             // churn: modelled seconds from a worker's last step to its process's exit (its last
                                 // checkpoint, FINISH, teardown); worker 0's exit follows the job's last update

  template <class V>
  void fields(V& v) {
    v("workers", workers, "virtual workers (nodes)", int64_t{1}, int64_t{4096});
    v("servers", servers, "ps: parameter-server shards (0 = one per worker, at most 16)", int64_t{0}, int64_t{4096});
    v("link_gbit", link_gbit, "each worker's link, Gbit/s per direction", 1e-6, 1e5);
    v("server_link_gbit", server_link_gbit, "each server's link, Gbit/s per direction (0 = link_gbit)", 0.0, 1e6);
    v("colocate_servers", colocate_servers, "ps: shard k on worker k mod N's node, sharing its link");
    v("ps_goodput", ps_goodput, "ps: share of the link rate parameter-server messages get (a probe's measured one)", 1e-3, 4.0);
    v("ring_goodput", ring_goodput, "ring: share of the link rate the ring's all-reduce gets (a probe's measured one)", 1e-3, 4.0);
    v("latency_us", latency_us, "one-way message latency, microseconds", 0.0, 1e7);
    v("sharing", sharing, "messages sent together share the uplink (fair) or go in order (fifo)",
      std::vector<std::string>{"fair", "fifo"});
    v("slow_workers", slow_workers, "comma-separated indices of stragglers (emulate.slowdown x slower)");
    v("slow_share", slow_share, "share of workers (the highest-numbered) that straggle", 0.0, 1.0);
    v("worker_slowdowns", worker_slowdowns, "one step-time factor per worker, comma-separated (empty = none)");
    v("slow_steps", slow_steps, "> 0: stragglers stop after this many steps (elastic budget)", int64_t{0}, int64_t{1} << 40);
    v("eval_workers", eval_workers, "workers that evaluate validation loss (0..N-1)", int64_t{1}, int64_t{4096});
    v("memory_gb", memory_gb, "refuse runs estimated above this many GiB (0 = 80% of available)", 0.0, 1e6);
    v("target_loss", target_loss, "> 0: end the run when worker 0's validation loss reaches this", 0.0, 1e6);
    v("time_limit_s", time_limit_s, "> 0: end the run when the simulated clock passes this, seconds", 0.0, 1e9);
    v("time_schedule", time_schedule, "the lr schedule by the simulated clock over sim.time_limit_s (train.steps a cap)");
    v("churn", churn, "membership events of an elastic ps job: kill9@T:W:D, sigterm@T:W:D, join@T:W (empty = none)");
    v("start_s", start_s, "seconds from a worker's launch to its first step", 0.0, 1e6);
    v("spread_start_s", spread_start_s, "worker r begins r / workers x this after start_s (0 = together)", 0.0, 1e6);
    v("restart_s", restart_s, "churn: seconds from a restarted or new worker's launch to its join (0 = start_s)", 0.0, 1e6);
    v("exit_s", exit_s, "churn: seconds from a worker's last step to its process's exit", 0.0, 1e6);
    v("flush_denormal", flush_denormal, "flush denormal floats to zero (faster; not bit for bit the workers' numerics)");
  }

  // The slow workers' indices (sorted, unique); throws syncopate::Error naming a bad entry.
  std::vector<int> slow_set() const;
  // sim.worker_slowdowns parsed: one factor per worker, or empty; throws syncopate::Error naming a bad entry.
  std::vector<double> slowdown_list() const;
  int64_t shard_count() const { return servers > 0 ? servers : (workers < 16 ? workers : 16); }
  double server_gbit() const { return server_link_gbit > 0 ? server_link_gbit : link_gbit; }
  // Cross-field checks; throws syncopate::Error with the field's name and how to fix it.
  void validate() const;
};

}  // namespace syncopate
