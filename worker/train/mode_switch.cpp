#include "worker/train/mode_switch.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/config_schema.h"
#include "worker/train/run_config.h"

namespace syncopate {
namespace {
std::string describe(const DistConfig& d) {
  if (d.mode == "ring" && d.sync_every > 1) return fmt::format("ring local SGD (sync_every={}, outer={})", d.sync_every, d.outer);
  if (d.mode == "ps" && d.sync_every > 1) return fmt::format("ps local SGD (sync_every={}, outer={})", d.sync_every, d.outer);
  return d.mode;
}
// The modes whose nodes hold AdamW's state themselves (a job of one node included; local SGD's inner
// optimizer in ps mode too); per-step ps keeps it on the shards.
bool nodes_hold_moments(const DistConfig& d) { return !(d.mode == "ps" && d.sync_every == 1); }
// Whether the trainer's token count is the job's (every replica's batch per step) rather than a node's.
bool counts_the_jobs_tokens(const DistConfig& d) { return d.mode == "ring" && (d.sync_every == 1 || d.elastic); }
}  // namespace

std::string ModeSwitch::summary() const {
  if (!switched) return "";
  return fmt::format("switching from {} to {} at this checkpoint: weights, step, data position and RNG carry over; {}{}",
                     from, to,
                     !moments_carried ? "AdamW's moments do not (they were on the shards, and moving them back to the "
                                        "nodes is not built): they start from zero"
                     : to_shards ? "AdamW's moments too (to the shards, with their INIT: a shard starts from the first "
                                   "node's that reaches it)"
                                 : "AdamW's moments too",
                     fresh_sync_state ? "; the nodes' checkpoints may differ, so every replica starts from the job's "
                                        "mean weights (the ring also from the mean moments and node 0's step count), "
                                        "and local SGD's round restarts there"
                                      : "");
}

ModeSwitch mode_switch(const nlohmann::json& meta, const DistConfig& now) {
  ModeSwitch s;
  if (!meta.contains("config") || !meta["config"].is_string()) return s;
  RunConfig then;
  ConfigSchema schema;
  then.bind(schema);
  try {
    schema.load_string(meta["config"].get<std::string>(), "the checkpoint's config");
  } catch (const Error&) {
    return s;  // written by another version: no switch detected, the load checks what it holds
  }
  const DistConfig& d = then.dist;
  if (d.mode == "auto") return s;  // (never written resolved: nothing to compare)
  s.switched = d.mode != now.mode || d.sync_every != now.sync_every || (now.sync_every > 1 && d.outer != now.outer);
  s.recount_tokens = counts_the_jobs_tokens(d) != counts_the_jobs_tokens(now);
  if (!s.switched) return s;
  s.from = describe(d);
  s.to = describe(now);
  // Nodes -> nodes as they are; nodes -> shards with INIT (protocol 8); shards -> nodes: not built.
  s.moments_carried = nodes_hold_moments(d);
  s.to_shards = nodes_hold_moments(d) && !nodes_hold_moments(now);
  s.fresh_sync_state = true;
  return s;
}

}  // namespace syncopate
