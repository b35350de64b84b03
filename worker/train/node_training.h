// One node's part of a training job: join the job, then train every local replica (one thread
// per GPU, or per CPU replica) until the run ends. Local replica 0 writes the node's outputs.
#pragma once
#include <string>

#include "worker/train/run_config.h"

namespace syncopate {

// When one local replica fails, the others are stopped (their collectives abort) and the first
// failure is rethrown: the root cause, not the replicas that stopped because of it. "{node}" in
// out_dir is replaced by the node's rank.
// Returns true when the job stopped at a checkpoint to switch synchronization (Trainer::switching).
bool train_node(RunConfig cfg, std::string out_dir, bool resume, const std::string& config_toml);

// This node's run directory ("{node}" replaced by its rank, from the environment as train_node
// resolves it), checked before anything starts: one that already holds a run (checkpoints/latest)
// is refused (syncopate::Error saying what to do) unless `resume` (continue it) or `force` (its
// metrics, samples and checkpoints are deleted here).
std::string claim_run_dir(RunConfig cfg, std::string out_dir, bool resume, bool force);

}  // namespace syncopate
