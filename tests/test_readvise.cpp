// The job's decisions to re-advise and switch (worker/train/readvise.h), on one replica (its job_sum
// is itself): node 0 asks once when a node drifts, keeps the pick when the answer does, and hands
// back the new advice's text byte for byte when the pick changes. Several nodes over a real ring:
// tests/readvise_switch_test.sh.
#include <filesystem>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/atomic_file.h"
#include "tests/test_helpers.h"
#include "worker/train/readvise.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
std::string advice(const std::string& name, const std::string& flags, const std::string& extra = "") {
  return R"({"format": "syncopate-advice/1", "recommended": {"name": ")" + name + R"(", "worker_flags": )" + flags +
         R"(, "server_flags": []})" + extra + "}";
}
const auto kOne = [](at::Tensor&) {};  // one replica: the job's sum is its own value
}  // namespace

TEST(Readvise, ThePickIsTheNameAndTheFlags) {
  EXPECT_EQ(Readvise::pick_of(advice("ring", R"(["--dist.mode=ring"])")), "ring (--dist.mode=ring)");
  EXPECT_EQ(Readvise::pick_of(R"({"recommended": {"name": "bsp", "worker_flags": ["--dist.mode=ps"],
      "server_flags": ["--ps.consistency=bsp"]}})"), "bsp (--dist.mode=ps) servers (--ps.consistency=bsp)");
  EXPECT_EQ(Readvise::pick_of("{not json"), "");
  EXPECT_EQ(Readvise::pick_of(R"({"recommended": {"worker_flags": []}})"), "");
  EXPECT_EQ(Readvise::pick_of("[1, 2]"), "");
}

TEST(Readvise, Node0AsksOnceOnDriftAndAKeptPickChangesNothing) {
  test::TempDir d;
  Readvise r(d.path().string(), true, advice("ring", R"(["--dist.mode=ring"])"));
  const auto cpu = at::TensorOptions().device(at::kCPU);
  EXPECT_FALSE(r.decide(10, false, kOne, cpu));  // no drift: no request
  EXPECT_FALSE(fs::exists(d.str(kReadviseRequestFile)));
  EXPECT_FALSE(r.decide(20, true, kOne, cpu));
  ASSERT_TRUE(fs::exists(d.str(kReadviseRequestFile)));
  EXPECT_NE(read_file(d.str(kReadviseRequestFile)).find("\"step\":20"), std::string::npos);
  fs::remove(d.str(kReadviseRequestFile));  // (the launcher took it)
  EXPECT_FALSE(r.decide(30, true, kOne, cpu));  // waiting for the answer: no second request
  EXPECT_FALSE(fs::exists(d.str(kReadviseRequestFile)));
  // The answer keeps the ring (other numbers, same pick): nothing changes, the answer is kept aside,
  // and this run asks no more.
  write_file_atomic(d.str(kReadviseAdviceFile), advice("ring", R"(["--dist.mode=ring"])", R"(, "cluster": {"step_s": 9})"));
  EXPECT_FALSE(r.decide(40, true, kOne, cpu));
  EXPECT_FALSE(fs::exists(d.str(kReadviseAdviceFile)));
  EXPECT_TRUE(fs::exists(d.str("readvise.step40.json")));
  EXPECT_FALSE(r.decide(50, true, kOne, cpu));
  EXPECT_FALSE(fs::exists(d.str(kReadviseRequestFile)));
  // Back within the advice at a decision step, then a new drift: asked again.
  EXPECT_FALSE(r.decide(60, false, kOne, cpu));
  EXPECT_FALSE(r.decide(70, true, kOne, cpu));
  EXPECT_TRUE(fs::exists(d.str(kReadviseRequestFile)));
}

TEST(Readvise, ANewPickComesBackByteForByteAndAnUnreadableAnswerIsNone) {
  test::TempDir d;
  Readvise r(d.path().string(), true, advice("ring", R"(["--dist.mode=ring"])"));
  const auto cpu = at::TensorOptions().device(at::kCPU);
  EXPECT_FALSE(r.decide(10, true, kOne, cpu));
  // Any bytes (7 to a shared integer; a length that is not a multiple of 7; UTF-8).
  const std::string next = advice("bsp_backup", R"(["--dist.mode=ps"])", R"(, "why": "straggler \u00d7 3 — ok")");
  write_file_atomic(d.str(kReadviseAdviceFile), next);
  const auto got = r.decide(20, false, kOne, cpu);
  ASSERT_TRUE(got);
  EXPECT_EQ(*got, next);

  test::TempDir e;
  Readvise bad(e.path().string(), true, advice("ring", R"(["--dist.mode=ring"])"));
  EXPECT_FALSE(bad.decide(10, true, kOne, cpu));
  fs::remove(e.str(kReadviseRequestFile));  // (the launcher took it)
  write_file_atomic(e.str(kReadviseAdviceFile), "{\"truncated\": ");
  EXPECT_FALSE(bad.decide(20, true, kOne, cpu));  // logged; the job goes on as it is, and asks no more
  EXPECT_FALSE(bad.decide(30, true, kOne, cpu));
  EXPECT_FALSE(fs::exists(e.str(kReadviseRequestFile)));
}

TEST(Readvise, OnlyNode0TouchesTheFiles) {
  test::TempDir d;
  Readvise r(d.path().string(), false, advice("ring", R"(["--dist.mode=ring"])"));
  write_file_atomic(d.str(kReadviseAdviceFile), advice("bsp", R"(["--dist.mode=ps"])"));
  EXPECT_FALSE(r.decide(10, true, kOne, at::TensorOptions()));
  EXPECT_FALSE(fs::exists(d.str(kReadviseRequestFile)));
  EXPECT_TRUE(fs::exists(d.str(kReadviseAdviceFile)));
}
