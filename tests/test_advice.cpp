// --dist.mode=auto (worker/sync/advice.h): the recommended [dist] flags of an advice.json are applied
// to the run's config; everything else an advice might try, and every way the file can be wrong, is
// refused by name.
#include <gtest/gtest.h>

#include <fstream>

#include "common/atomic_file.h"
#include "common/config_schema.h"
#include "tests/test_helpers.h"
#include "worker/sync/advice.h"
#include "worker/train/run_config.h"

using namespace syncopate;

namespace {
struct Bound {
  RunConfig cfg, fresh;
  ConfigSchema schema, defaults;
  Bound() {
    cfg.bind(schema);
    fresh.bind(defaults);
    cfg.dist.mode = "auto";
  }
};

std::string advice(const std::string& flags, const std::string& extra = "") {
  return R"({"format": "syncopate-advice/1", "cluster": {"nodes": 4},)" + extra +
         R"( "candidates": [{"name": "diloco10", "predicted_s": {"mean": 12.5}}],
             "recommended": {"name": "diloco10", "resolved": true, "worker_flags": [)" + flags +
         R"(], "server_flags": ["--ps.consistency=asp"]}})";
}
}  // namespace

TEST(Advice, TheRecommendedDistFlagsAreAppliedAndLogged) {
  test::TempDir d;
  write_file_atomic(d.str("advice.json"), advice(R"("--dist.mode=ring", "--dist.sync_every=10", "--dist.outer=nesterov")"));
  Bound b;
  const AppliedAdvice a = apply_advice(b.schema, b.defaults, d.str("advice.json"), 4);
  EXPECT_EQ(b.cfg.dist.mode, "ring");
  EXPECT_EQ(b.cfg.dist.sync_every, 10);
  EXPECT_EQ(a.name, "diloco10");
  EXPECT_EQ(a.flags.size(), 3u);
  EXPECT_EQ(a.server_flags, std::vector<std::string>{"--ps.consistency=asp"});
  EXPECT_NE(a.summary.find("predicted 12.5 s"), std::string::npos) << a.summary;
  EXPECT_TRUE(a.warnings.empty());
  // Made for 4 nodes, used on 2: said.
  Bound c;
  const AppliedAdvice w = apply_advice(c.schema, c.defaults, d.str("advice.json"), 2);
  ASSERT_EQ(w.warnings.size(), 1u);
  EXPECT_NE(w.warnings[0].find("made for 4 nodes and this job has 2"), std::string::npos) << w.warnings[0];
}

TEST(Advice, AFieldTheUserSetOtherwiseIsRefusedNotOverridden) {
  test::TempDir d;
  write_file_atomic(d.str("advice.json"), advice(R"("--dist.mode=ring", "--dist.sync_every=10")"));
  Bound b;
  b.cfg.dist.sync_every = 5;
  const std::string e = test::error_of([&] { apply_advice(b.schema, b.defaults, d.str("advice.json"), 4); });
  EXPECT_NE(e.find("dist.sync_every = 5 is set for this job"), std::string::npos) << e;
  EXPECT_NE(e.find("drop --dist.sync_every"), std::string::npos) << e;
  // A value given on the command line is the user's even where it equals the default.
  Bound explicit_default;
  const std::string e2 = test::error_of(
      [&] { apply_advice(explicit_default.schema, explicit_default.defaults, d.str("advice.json"), 4, {"dist.sync_every"}); });
  EXPECT_NE(e2.find("dist.sync_every = 1 is set for this job"), std::string::npos) << e2;
  // The same value the advice gives is no conflict.
  Bound same;
  same.cfg.dist.sync_every = 10;
  EXPECT_EQ(test::error_of([&] { apply_advice(same.schema, same.defaults, d.str("advice.json"), 4); }), "");
}

TEST(Advice, BadAdviceIsRefusedByName) {
  test::TempDir d;
  auto refused = [&](const std::string& text, const std::string& expect) {
    write_file_atomic(d.str("a.json"), text);
    Bound b;
    const std::string e = test::error_of([&] { apply_advice(b.schema, b.defaults, d.str("a.json"), 4); });
    EXPECT_NE(e.find(expect), std::string::npos) << "expected '" << expect << "' in: " << e;
    EXPECT_EQ(b.cfg.optim.lr, RunConfig().optim.lr) << "nothing outside [dist] changed";
  };
  {
    Bound b;
    const std::string e = test::error_of([&] { apply_advice(b.schema, b.defaults, d.str("none.json"), 4); });
    EXPECT_NE(e.find("cannot read the advice"), std::string::npos) << e;
    EXPECT_NE(e.find("syncopate-advise"), std::string::npos) << e;
  }
  refused("{not json", "is not JSON");
  refused(R"({"format": "syncopate-probe/1"})", "is not an advice file");
  refused(R"({"format": "syncopate-advice/1", "recommended": {}})", "has no recommended.worker_flags");
  refused(advice(R"("--optim.lr=1", "--dist.mode=ring")"), "may only set [dist] fields");
  refused(advice(R"("--dist.mode=auto")"), "recommends dist.mode=auto");
  refused(advice(R"("--dist.sync_every=10")"), "does not set dist.mode");
  refused(advice(R"("--dist.mode=ring", "--dist.nonsense=3")"), "not the synchronization's to choose");
  // Membership, addresses and security stay the job's, whatever an advice file says.
  for (const char* f : {"--dist.servers=tcp://6.6.6.6:1", "--dist.ps_encrypt=off", "--dist.master_addr=6.6.6.6",
                        "--dist.nnodes=7", "--dist.node_rank=3", "--dist.timeout_s=86400", "--dist.curve_server_key=x"})
    refused(advice(std::string(R"("--dist.mode=ps", ")") + f + "\""), "not the synchronization's to choose");
  refused(advice(R"("--dist.mode=ring", "--dist.sync_every=10", "--dist.sync_every=20")"), "sets dist.sync_every twice");
  refused(advice(R"("--dist.mode=ring", "--dist.sync_every=-4")"), "sync_every");
  refused(advice(R"("--dist.mode=ring", "--dist.advice=x.json")"), "names another advice");
}

TEST(Advice, AnUnresolvedOrUnvalidatedAdviceIsAppliedWithAWarning) {
  test::TempDir d;
  std::string text = advice(R"("--dist.mode=ps")", R"( "validated": {"inside": false, "notes": ["N = 64"]},)");
  text.replace(text.find("\"resolved\": true"), 16, "\"resolved\": false");
  write_file_atomic(d.str("advice.json"), text);
  Bound b;
  const AppliedAdvice a = apply_advice(b.schema, b.defaults, d.str("advice.json"), 4);
  EXPECT_EQ(b.cfg.dist.mode, "ps");
  ASSERT_EQ(a.warnings.size(), 2u);
  EXPECT_NE(a.warnings[0].find("did not resolve"), std::string::npos);
  EXPECT_NE(a.warnings[1].find("outside the simulator's validated range"), std::string::npos);
}
