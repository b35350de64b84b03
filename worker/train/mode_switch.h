// Resuming a checkpoint in another synchronization than the one that wrote it (issue 29, second
// stage: taking a new advice's pick from the job's newest checkpoint). What carries over:
//  - always: the weights, the step (and so the learning-rate schedule), the data position, the RNG;
//  - between modes whose nodes hold AdamW's state (the ring, local SGD / DiLoCo on the ring or on
//    the servers, whose inner optimizer is the node's): AdamW's moments and step count too. Local SGD's own state (the round's start, the outer
//    momentum) starts afresh at the checkpoint's weights; after local SGD, whose inner moments
//    differ per node, the ring takes node 0's moments with its weights (RingSync::start), so the
//    replicas stay identical;
//  - to or from per-step parameter servers (BSP, SSP, ASP), AdamW's moments do not: they live on
//    the shards there and on the nodes otherwise, and moving them is not built. The moments start
//    from zero (ring) or the shards start theirs from the workers' INIT (ps); the log says so.
//  - into a ps mode, the shards must start from the workers' INIT: shards that restored checkpoints
//    of an earlier ps phase would take the job back there, and are refused (check_switched_shards).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "worker/sync/dist_config.h"

namespace syncopate {

struct ModeSwitch {
  bool switched = false;         // the checkpoint's mode, sync_every or outer rule differ from this run's
  std::string from, to;          // "ring", "ring local SGD (sync_every=10, outer=nesterov)", "ps (sync_every=1)"
  bool moments_carried = true;   // AdamW's moments move with the weights (false across ring <-> ps)
  bool fresh_sync_state = false; // the synchronization's own checkpointed state is absent or not its own: start it anew
  std::string summary() const;   // one log line
};

// meta: the checkpoint's meta.json (its "config" holds the run's resolved TOML). A checkpoint whose
// config cannot be read (an older version's fields) counts as no switch: the load then checks what
// it holds, as before.
ModeSwitch mode_switch(const nlohmann::json& meta, const DistConfig& now);

}  // namespace syncopate
