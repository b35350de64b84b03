// Resuming a checkpoint in another synchronization than the one that wrote it (issue 29, second
// stage: taking a new advice's pick from the job's newest checkpoint). What carries over:
//  - always: the weights, the step (and so the learning-rate schedule), the data position, the RNG;
//  - between modes whose nodes hold AdamW's state (the ring, local SGD / DiLoCo on the ring or on
//    the servers, whose inner optimizer is the node's): AdamW's moments and step count too;
//  - into per-step parameter servers (BSP, SSP, ASP), whose shards hold AdamW's state: the node's
//    moments and step count go to the shards with INIT (GradientSync::carried_optimizer; protocol 8's
//    `moments`), and a shard starts its AdamW from the first INIT that reaches it (identical on every
//    node after the ring; a node's own inner state after local SGD mid-round);
//  - out of per-step parameter servers: the moments stay on the shards (moving them back is not
//    built) and start from zero on the nodes; the log says so.
// The nodes' checkpoints may differ (local SGD mid-round, asynchronous ps): after a switch the ring
// and local SGD start every replica from the job's mean weights (the ring from the mean moments
// and node 0's step count too), and local SGD's round restarts there with zero outer momentum
// (GradientSync::restart_state, then start()). The token count restarts in the new mode's meaning.
// Into a ps mode the shards must start from the workers' INIT: shards that restored checkpoints of
// an earlier ps phase would take the job back there, and are refused (check_switched_shards).
// Known gaps: shards of an earlier ps phase still running (never restarted) are not detected; each
// node decides from its own checkpoint's config. (The elastic ring and elastic local SGD take the
// mean of the members at the root's step, where a node may start fresh or from an older checkpoint.)
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "worker/sync/dist_config.h"

namespace syncopate {

struct ModeSwitch {
  bool switched = false;         // the checkpoint's mode, sync_every or outer rule differ from this run's
  std::string from, to;          // "ring", "ring local SGD (sync_every=10, outer=nesterov)", "ps (sync_every=1)"
  bool moments_carried = true;   // AdamW's moments move with the weights (false from per-step ps to the nodes)
  bool to_shards = false;        // they move from the nodes to the shards (into per-step ps)
  bool fresh_sync_state = false; // the synchronization's own checkpointed state is absent or not its own: start it anew
  bool recount_tokens = false;   // the checkpoint's token count means another thing (the job's vs a node's: a switch
                                 // between them, or ring local SGD resumed with dist.elastic toggled, the elastic one
                                 // counting every member's): it restarts as step x this run's tokens per step
  std::string summary() const;   // one log line
};

// meta: the checkpoint's meta.json (its "config" holds the run's resolved TOML). A checkpoint whose
// config cannot be read (an older version's fields) counts as no switch: the load then checks what
// it holds, as before.
ModeSwitch mode_switch(const nlohmann::json& meta, const DistConfig& now);

}  // namespace syncopate
