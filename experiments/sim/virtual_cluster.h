// syncopate-sim's engine: N virtual workers train the real model in simulated time.
//
// Gradients are computed for real, one worker at a time, each on the parameters that worker
// holds at that moment (its possibly stale copy) and on the batch it would see in a real run
// (WindowSampler's rule for replica r of N). A discrete-event loop (EventQueue) orders
// everything by simulated time: a worker's compute takes its StepPacer's modelled time (the
// emulation's compute model: step time, slowdown, seeded jitter); a message takes latency +
// bytes / rate on both ends' links, queueing behind earlier messages (NetworkModel); the ring
// takes the alpha-beta time of the pipelined ring all-reduce. The update rules are the real ones:
// FlatAdamW and clip_grad_norm (ring, inner steps), ParameterShard with its ConsistencyRule and
// StalenessMitigation (ps), OuterOptimizer (local SGD / DiLoCo, in the ring or the shards).
//
// Writes OUT/node<r>/metrics.jsonl per worker (the trainer's fields; time_s and unix_s in
// simulated seconds from the start; compute_s is the modelled compute, as the simulated device
// spent it: real seconds, which differ from run to run, go only to sim.json), OUT/logs/server<k>.log with the shard's stats line as
// syncopate-server prints it, and OUT/sim.json (simulated and real seconds, events, bytes).
// Deterministic: the same config gives byte-identical files.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

#include "experiments/sim/sim_config.h"
#include "server/ps_config.h"
#include "worker/train/run_config.h"

namespace syncopate {

struct SimResult {
  double sim_s = 0;          // simulated seconds until the last worker finished
  int64_t worker_steps = 0;  // optimizer steps taken by all workers together
  double real_s = 0;         // wall-clock seconds of the simulation
  double gradient_s = 0;     // of which computing gradients (forward + backward)
  double eval_s = 0;         // of which evaluating validation loss
  double update_s = 0;       // of which the update rules (shards' pushes, the ring's AdamW, outer and inner steps)
  double target_s = -1;      // sim.target_loss: simulated seconds at which worker 0 reached it (-1: never)
  int64_t events = 0;        // events the scheduler processed
  int64_t tokens = 0;        // training tokens of all workers together
  double final_val_loss = std::numeric_limits<double>::quiet_NaN();  // worker 0's last evaluation (NaN: none)
  std::string final_eval_of; // which weights it scored (eval_of: replica, outer, servers)
  double bytes_sent = 0;     // bytes the workers and the shards sent (the ring's: modelled)
  std::string ended_by = "steps";  // what ended the run: "steps" (every worker's train.steps), "time_limit"
                                   // (sim.time_limit_s passed) or "target" (sim.target_loss reached)
};

// Estimated peak memory of a run, bytes: the model and its optimizer once, what each worker must
// hold (its parameters in ps and local SGD, its gradient while in flight, local SGD's inner
// AdamW state and round start), the shards' state (DC-ASGD: two parameter backups per worker).
double sim_memory_estimate(const RunConfig& run, const PsConfig& ps, const SimConfig& sim);

// Checks the combination (modes and options the simulator models, ranges) before anything
// starts; throws syncopate::Error naming the field and how to fix it. Includes the memory check.
void validate_simulation(const RunConfig& run, const PsConfig& ps, const SimConfig& sim);

// Runs the whole simulation; writes the files above under `out`. verbose: progress lines.
SimResult run_simulation(const RunConfig& run, const PsConfig& ps, const SimConfig& sim, const std::string& out,
                         bool verbose);

}  // namespace syncopate
