// The run against its advice (worker/train/advice_watch.h): what the advice assumed for a node, and
// drift reported when the node's own step time is 2x off it over a window, once when it starts and
// once when it ends.
#include <gtest/gtest.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "tests/test_helpers.h"
#include "worker/train/advice_watch.h"

using namespace syncopate;

TEST(AdviceWatch, TheAdvisedStepIsTheBaseTimesTheNodesSlowdownAndJitter) {
  test::TempDir d;
  write_file_atomic(d.str("a.json"), R"({"cluster": {"nodes": 3, "step_s": 0.4, "jitter": 0.25,
      "node_slowdowns": {"0": 1.0, "1": 3.0, "2": 1.05}, "slow_workers": [1], "slowdown": 3.0}})");
  EXPECT_DOUBLE_EQ(advised_node(d.str("a.json"), 0).step_s, 0.4 * 1.25);
  EXPECT_DOUBLE_EQ(advised_node(d.str("a.json"), 1).step_s, 0.4 * 3 * 1.25);
  EXPECT_DOUBLE_EQ(advised_node(d.str("a.json"), 2).step_s, 0.4 * 1.05 * 1.25);
  EXPECT_NE(advised_node(d.str("a.json"), 1).why.find("x 3 for this node"), std::string::npos);
  // Without per-node factors: the slow workers' common slowdown.
  write_file_atomic(d.str("b.json"), R"({"cluster": {"step_s": 0.2, "slow_workers": [2], "slowdown": 2.5}})");
  EXPECT_DOUBLE_EQ(advised_node(d.str("b.json"), 2).step_s, 0.5);
  EXPECT_DOUBLE_EQ(advised_node(d.str("b.json"), 0).step_s, 0.2);
  // Nothing usable: no expectation (the trainer then watches nothing); unreadable: named.
  write_file_atomic(d.str("c.json"), R"({"cluster": {"nodes": 2}})");
  EXPECT_EQ(advised_node(d.str("c.json"), 0).step_s, 0);
  write_file_atomic(d.str("d.json"), "{not json");
  EXPECT_NE(test::error_of([&] { advised_node(d.str("d.json"), 0); }).find("d.json' is not JSON"), std::string::npos);
  EXPECT_NE(test::error_of([&] { advised_node(d.str("none.json"), 0); }).find("cannot read the applied advice"),
            std::string::npos);
}

TEST(AdviceWatch, DriftIsReportedWhenItStartsAndWhenItEnds) {
  AdvisedNode n;
  n.step_s = 0.5;
  n.why = "test";
  AdviceWatch w(n, /*window=*/4, /*factor=*/2.0);
  int64_t step = 0;
  auto feed = [&](double s, int k) {
    std::vector<std::string> said;
    for (int i = 0; i < k; ++i)
      if (auto m = w.observe(++step, s)) said.push_back(*m);
    return said;
  };
  EXPECT_TRUE(feed(0.6, 10).empty());  // 1.2x: as advised
  EXPECT_NEAR(w.ratio(), 1.2, 1e-12);
  EXPECT_FALSE(w.drifting());
  // The node slows 3x: reported once, when the window's (upper) median crosses 2x: the second slow step of 4.
  auto said = feed(1.5, 6);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("step 12:"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("3.00x what the advice assumed"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("--from-run"), std::string::npos) << said[0];
  EXPECT_TRUE(w.drifting());
  // Back to normal: one line saying so.
  said = feed(0.5, 6);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("back within 1.41x"), std::string::npos) << said[0];
  EXPECT_FALSE(w.drifting());
  // At the edge (1.9x, then 2.1x, then 1.8x): drift starts once and does not end until back within 1.41x.
  said = feed(0.95, 6);
  EXPECT_TRUE(said.empty());
  said = feed(1.05, 6);
  ASSERT_EQ(said.size(), 1u);
  said = feed(0.9, 6);
  EXPECT_TRUE(said.empty()) << said[0];
  EXPECT_TRUE(w.drifting());
  said = feed(0.5, 6);
  ASSERT_EQ(said.size(), 1u);
  // Much faster than advised is drift too (the advice over-estimated this node).
  said = feed(0.2, 6);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NEAR(w.ratio(), 0.4, 1e-12);
}

TEST(AdviceWatch, NoExpectationWatchesNothing) {
  AdviceWatch w(AdvisedNode{}, 2);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(w.observe(i, 100.0).has_value());
  EXPECT_EQ(w.ratio(), 0);
}
