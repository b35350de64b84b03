// The timeline writer: valid Chrome trace JSON from several threads, spans that measure what they
// enclose, named tracks, clock offsets, a bad path refused at open, nothing recorded when off.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/trace.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {
nlohmann::json events_named(const nlohmann::json& all, const std::string& name) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : all)
    if (e.value("name", "") == name) out.push_back(e);
  return out;
}
}  // namespace

TEST(Trace, SpansFromSeveralThreadsMakeOneValidChromeTrace) {
  test::TempDir dir;
  const std::string path = dir.str("t.json");
  {
    TraceSession session(path, "worker node 3");
    Tracer::global().name_thread("main");
    {
      TraceSpan outer("step", "train");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::thread other([] {
      Tracer::global().name_thread("communication");
      for (int i = 0; i < 2000; ++i) Tracer::global().complete("reduce region", "comm", 100 + i, 150 + i, -1, "\"region\":1");
    });
    other.join();
    Tracer::global().name_track(1000, "shard 0 push and pull");
    Tracer::global().complete("push and pull", "ps", 5, 9, 1000);
    Tracer::global().clock_sync("server shard 0", -1234.5, 80);
  }
  EXPECT_FALSE(Tracer::global().on());
  const auto all = nlohmann::json::parse(read_file(path));  // the whole file parses (64 KiB blocks joined)
  ASSERT_TRUE(all.is_array());
  const auto step = events_named(all, "step");
  ASSERT_EQ(step.size(), 1u);
  EXPECT_EQ(step[0]["ph"], "X");
  EXPECT_GE(step[0]["dur"].get<int64_t>(), 20000);  // microseconds: it enclosed the 20 ms sleep
  EXPECT_LT(std::abs(step[0]["ts"].get<int64_t>() - Tracer::now_us()), 60'000'000);  // Unix-epoch microseconds
  const auto regions = events_named(all, "reduce region");
  ASSERT_EQ(regions.size(), 2000u);
  EXPECT_NE(regions[0]["tid"], step[0]["tid"]);  // each thread its own track
  EXPECT_EQ(regions[7]["args"]["region"], 1);
  EXPECT_EQ(regions[7]["dur"], 50);
  EXPECT_EQ(events_named(all, "push and pull")[0]["tid"], 1000);
  const auto sync = events_named(all, "clock_sync");
  ASSERT_EQ(sync.size(), 1u);
  EXPECT_EQ(sync[0]["args"]["reference"], "server shard 0");
  EXPECT_EQ(sync[0]["args"]["offset_us"], -1234.5);
  EXPECT_EQ(events_named(all, "process_name")[0]["args"]["name"], "worker node 3");
  int named = 0;
  for (const auto& e : events_named(all, "thread_name")) named += e["args"]["name"] == "communication";
  EXPECT_EQ(named, 1);
}

TEST(Trace, OffRecordsNothingAndABadPathFailsAtOpen) {
  EXPECT_FALSE(Tracer::global().on());
  { TraceSpan s("nothing", "x"); }  // no file, no error
  try {
    TraceSession bad("/nonexistent-dir/t.json", "worker node 0");
    FAIL() << "opened a trace in a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/t.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--trace.file"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(Tracer::global().on());
}
