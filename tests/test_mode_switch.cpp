// What a resume in another synchronization carries over (worker/train/mode_switch.h): AdamW's
// moments go wherever the checkpoint's nodes held them (nodes to nodes, nodes to a per-step ps
// mode's shards with INIT), never from the shards back to the nodes.
#include <gtest/gtest.h>

#include "common/config_schema.h"
#include "worker/train/mode_switch.h"
#include "worker/train/run_config.h"

using namespace syncopate;

namespace {
nlohmann::json meta_of(const std::string& mode, int64_t sync_every) {
  RunConfig c;
  c.dist.mode = mode;
  c.dist.sync_every = sync_every;
  ConfigSchema s;
  c.bind(s);
  return {{"config", s.to_toml()}};
}
DistConfig now(const std::string& mode, int64_t sync_every) {
  DistConfig d;
  d.mode = mode;
  d.sync_every = sync_every;
  return d;
}
}  // namespace

TEST(ModeSwitch, MomentsGoWhereTheNodesHeldThem) {
  const ModeSwitch ring_to_ps = mode_switch(meta_of("ring", 1), now("ps", 1));
  EXPECT_TRUE(ring_to_ps.switched);
  EXPECT_TRUE(ring_to_ps.moments_carried);
  EXPECT_TRUE(ring_to_ps.to_shards);
  EXPECT_NE(ring_to_ps.summary().find("AdamW's moments too (to the shards"), std::string::npos);
  const ModeSwitch ps_to_ring = mode_switch(meta_of("ps", 1), now("ring", 1));
  EXPECT_FALSE(ps_to_ring.moments_carried);
  EXPECT_FALSE(ps_to_ring.to_shards);
  EXPECT_NE(ps_to_ring.summary().find("AdamW's moments do not"), std::string::npos);
  const ModeSwitch ring_to_diloco = mode_switch(meta_of("ring", 1), now("ring", 10));
  EXPECT_TRUE(ring_to_diloco.moments_carried);
  EXPECT_FALSE(ring_to_diloco.to_shards);
  const ModeSwitch ps_diloco_to_ps = mode_switch(meta_of("ps", 10), now("ps", 1));  // local SGD's inner state: the nodes'
  EXPECT_TRUE(ps_diloco_to_ps.moments_carried);
  EXPECT_TRUE(ps_diloco_to_ps.to_shards);
  const ModeSwitch ps_to_ps_diloco = mode_switch(meta_of("ps", 1), now("ps", 10));
  EXPECT_FALSE(ps_to_ps_diloco.moments_carried);
  EXPECT_FALSE(mode_switch(meta_of("ring", 1), now("ring", 1)).switched);
}
