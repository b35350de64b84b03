// spread_layout (worker/sync/probe_shards.h): which of the job's shards a node runs for the probe's
// spread rounds, and why the rounds are skipped where the layout is not known.
#include <gtest/gtest.h>

#include "worker/sync/probe_shards.h"

namespace syncopate {
namespace {

const std::vector<std::string> kEndpoints = {"tcp://10.77.0.1:5000", "tcp://10.77.0.2:5001", "tcp://10.77.0.1:5002"};

TEST(SpreadLayout, EachNodeRunsTheShardsAtItsAddress) {
  const std::vector<std::optional<std::string>> nodes = {"10.77.0.1", "10.77.0.2", "10.77.0.3"};
  const std::vector<std::optional<std::string>> shards = {"10.77.0.1", "10.77.0.2", "10.77.0.1"};
  EXPECT_EQ(spread_layout(nodes, shards, kEndpoints, 0).hosted, (std::vector<int>{0, 2}));
  EXPECT_EQ(spread_layout(nodes, shards, kEndpoints, 1).hosted, (std::vector<int>{1}));
  const SpreadLayout none = spread_layout(nodes, shards, kEndpoints, 2);  // a node that hosts no shard
  EXPECT_TRUE(none.hosted.empty());
  EXPECT_EQ(none.why_not, "");
}

TEST(SpreadLayout, AnUnknownLayoutIsNamedAndHostsNothing) {
  const std::vector<std::optional<std::string>> shards = {"10.77.0.1", "10.77.0.2", "10.77.0.1"};
  // A node without an address.
  SpreadLayout l = spread_layout({"10.77.0.1", std::nullopt}, shards, kEndpoints, 0);
  EXPECT_EQ(l.why_not, "node 1 recorded no address");
  EXPECT_TRUE(l.hosted.empty());
  // Nodes on one host (loopback): which node's link a shard shares is unknown.
  l = spread_layout({"127.0.0.1", "127.0.0.1"}, {"127.0.0.1"}, {"tcp://127.0.0.1:5000"}, 0);
  EXPECT_NE(l.why_not.find("nodes share the address 127.0.0.1"), std::string::npos) << l.why_not;
  EXPECT_TRUE(l.hosted.empty());
  // A shard on a host of its own, or one whose host did not resolve: named with its endpoint.
  l = spread_layout({"10.77.0.1", "10.77.0.2"}, {"10.77.0.1", "10.77.0.9"}, kEndpoints, 0);
  EXPECT_NE(l.why_not.find("shard 1 (tcp://10.77.0.2:5001) is not at a node's address"), std::string::npos) << l.why_not;
  EXPECT_TRUE(l.hosted.empty());  // (shard 0 was at node 0's address: nothing is started when one is unknown)
  l = spread_layout({"10.77.0.1", "10.77.0.2"}, {std::nullopt}, kEndpoints, 0);
  EXPECT_NE(l.why_not.find("shard 0 "), std::string::npos) << l.why_not;
}

}  // namespace
}  // namespace syncopate
