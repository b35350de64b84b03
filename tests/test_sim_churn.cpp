// Elastic membership in the virtual cluster (sim.churn, experiments/sim/churn_schedule.h): the
// schedule's parsing, and jobs whose workers crash, are preempted and join, checked for what the
// emulated cluster guarantees (every sample granted once, every worker's steps applied once, the job
// completes) and for what the events cost (goodput, lost steps, the wait for a crashed worker).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "experiments/sim/churn_schedule.h"
#include "experiments/sim/virtual_cluster.h"
#include "test_helpers.h"

using namespace syncopate;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::vector<nlohmann::json> steps_of(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (auto& m : test::read_jsonl(path))
    if (m.contains("loss")) out.push_back(m);
  return out;
}
nlohmann::json sim_json(const std::string& out) { return nlohmann::json::parse(slurp(out + "/sim.json")); }
nlohmann::json stats_of(const std::string& out, int k) {
  const std::string s = slurp(out + "/logs/server" + std::to_string(k) + ".log");
  return nlohmann::json::parse(s.substr(s.find('{')));
}

struct Job {
  RunConfig run;
  PsConfig ps;
  SimConfig sim;
};
// Three workers, two shards, elastic, 30 steps of 0.1 s modelled compute.
Job elastic_job(const test::TempDir& d, const std::string& consistency, int64_t every = 1) {
  Job j;
  j.run = test::tiny_run_config(d);
  j.run.dist.mode = "ps";
  j.run.dist.elastic = true;
  j.run.train.steps = 30;
  j.run.train.batch_size = 2;
  j.run.emulate.step_time_s = 0.1;
  j.run.eval.every = 0;
  if (every > 1) {
    j.run.dist.sync_every = every;
    j.run.dist.outer = consistency == "asp" ? "delayed_nesterov" : "nesterov";
  }
  j.ps.consistency = consistency;
  j.ps.worker_timeout_s = 0.5;
  j.sim.workers = 3;
  j.sim.servers = 2;
  j.sim.link_gbit = 1;
  j.sim.start_s = 0.2;
  return j;
}

// The steps each worker logged, and the data positions of the steps whose updates were applied, as
// experiments/churn.py counts them: local SGD (every > 1) takes a worker's last record of each step
// in a round it pushed (a partial round is dropped and its grant given again), per-step modes every
// step logged.
struct Logged {
  std::map<int, std::vector<int64_t>> steps;  // worker -> steps logged, in order
  std::vector<int64_t> positions;
  int joined = 0;
};
Logged logged(const std::string& out, int workers, int64_t every = 1) {
  Logged l;
  for (int r = 0; r < workers; ++r) {
    std::map<int64_t, int64_t> last;  // step -> its last record's position
    for (const auto& m : test::read_jsonl(out + "/node" + std::to_string(r) + "/metrics.jsonl")) {
      if (m.contains("joined_at_step")) ++l.joined;
      if (!m.contains("loss")) continue;
      l.steps[r].push_back(m["step"].get<int64_t>());
      last[m["step"].get<int64_t>()] = m["data_position"].get<int64_t>();
    }
    for (const auto& [step, pos] : last)
      if (last.count(((step - 1) / every + 1) * every)) l.positions.push_back(pos);
  }
  return l;
}

}  // namespace

TEST(ChurnSchedule, ParsesSortsAndRefusesByName) {
  const auto ev = parse_churn_schedule(" join@2:3, kill9@1:0:2,sigterm@2.5:3:1 ", 3);  // sorted by time
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].kind, ChurnEvent::Kind::kKill9);
  EXPECT_DOUBLE_EQ(ev[0].delay_s, 2.0);
  EXPECT_EQ(ev[1].kind, ChurnEvent::Kind::kJoin);
  EXPECT_EQ(ev[2].kind, ChurnEvent::Kind::kSigterm);
  EXPECT_EQ(ev[2].worker, 3);
  EXPECT_EQ(churn_joins(ev), 1);
  EXPECT_TRUE(parse_churn_schedule("", 3).empty());
  auto err = [](const std::string& s) { return test::error_of([&] { parse_churn_schedule(s, 3); }); };
  EXPECT_EQ(err("kill9@1:0:2,join@4.5:3,sigterm@5:3:1"), "");
  EXPECT_NE(err("sigterm@2.5:3:1,join@4.5:3").find("names worker 3, which does not exist by then"), std::string::npos);
  EXPECT_NE(err("reboot@1:0:2").find("unknown kind 'reboot'"), std::string::npos);
  EXPECT_NE(err("kill9@1:0").find("2 fields after '@', 3 expected"), std::string::npos);
  EXPECT_NE(err("kill9@-1:0:2").find("time '-1' is not a number"), std::string::npos);
  EXPECT_NE(err("join@1:4").find("the next new worker is 3"), std::string::npos);
  EXPECT_NE(err("kill9 1:0:2").find("has no '@'"), std::string::npos);
  EXPECT_NE(err("kill9@1:0.5:2").find("is not an id"), std::string::npos);
}

TEST(SimChurn, RefusesChurnWithoutAnElasticParameterServerJob) {
  test::TempDir d;
  auto err = [&](Job j) { return test::error_of([&] { validate_simulation(j.run, j.ps, j.sim); }); };
  Job ok = elastic_job(d, "asp");
  ok.sim.churn = "kill9@1:0:1";
  EXPECT_EQ(err(ok), "");
  Job j = ok;
  j.run.dist.elastic = false;
  EXPECT_NE(err(j).find("sim.churn without dist.elastic"), std::string::npos);
  j = ok;
  j.run.dist.mode = "ring";
  EXPECT_NE(err(j).find("dist.elastic with a ring"), std::string::npos);
  j = ok;
  j.sim.churn = "join@1:5";
  EXPECT_NE(err(j).find("sim.churn"), std::string::npos);
}

// ASP: a crash, a preemption and a join. The job completes; every sample is granted once; every
// push the shards applied is one step of one worker; the crashed worker comes back and the joiner
// steps; the events cost goodput against the same job without them; the same config gives the same
// files.
TEST(SimChurn, AspRidesOutACrashAPreemptionAndAJoinWithEverySampleOnce) {
  test::TempDir d;
  Job ref = elastic_job(d, "asp");
  run_simulation(ref.run, ref.ps, ref.sim, d.str("ref"), false);
  Job j = ref;
  j.sim.churn = "kill9@0.6:1:0.4,sigterm@1.2:2:0.3,join@1.5:3";
  run_simulation(j.run, j.ps, j.sim, d.str("a"), false);
  run_simulation(j.run, j.ps, j.sim, d.str("b"), false);
  for (int r = 0; r < 4; ++r) {
    const std::string f = "/node" + std::to_string(r) + "/metrics.jsonl";
    EXPECT_EQ(slurp(d.str("a") + f), slurp(d.str("b") + f)) << f;
  }
  const Logged l = logged(d.str("a"), 4);
  EXPECT_EQ(l.joined, 3);  // the crashed worker, the preempted one, the new one
  const std::set<int64_t> distinct(l.positions.begin(), l.positions.end());
  EXPECT_EQ(distinct.size(), l.positions.size()) << "a sample granted twice";
  for (const auto& [r, steps] : l.steps) {
    EXPECT_EQ(steps.back(), 30) << "worker " << r << " did not reach the budget";
    for (size_t i = 1; i < steps.size(); ++i) EXPECT_LT(steps[i - 1], steps[i]) << "worker " << r << " logged a step twice";
  }
  EXPECT_GT(l.steps.at(3).size(), 0u);
  EXPECT_LT(l.steps.at(3).front(), 30);
  const auto m = sim_json(d.str("a"))["membership"];
  EXPECT_EQ(m["events_applied"].get<int>(), 3);
  EXPECT_EQ(m["launches"].get<int>(), 3);
  EXPECT_EQ(m["joins"].get<int>(), 3);
  EXPECT_EQ(m["lost_steps"]["in_flight"].get<int>(), 1);
  // Exactly once: the first part applied one update per push that was not a duplicate, and every
  // step a worker logged was one push (plus the crashed step's, if it left before the crash).
  size_t logged_steps = 0;
  for (const auto& [r, steps] : l.steps) logged_steps += steps.size();
  const int64_t updates = stats_of(d.str("a"), 0)["updates"].get<int64_t>();
  EXPECT_EQ(updates, m["pushes_to_first_part"].get<int64_t>() - m["duplicates"].get<int64_t>());
  EXPECT_GE(updates, static_cast<int64_t>(logged_steps));
  EXPECT_LE(updates, static_cast<int64_t>(logged_steps) + 1);
  const auto mr = sim_json(d.str("ref"))["membership"];
  EXPECT_EQ(mr["events_applied"].get<int>(), 0);
  EXPECT_GT(mr["goodput"].get<double>(), m["goodput"].get<double>());
  EXPECT_GT(mr["goodput"].get<double>(), 0.9);
  EXPECT_LE(mr["goodput"].get<double>(), 1.0 + 1e-9);
}

// DiLoCo on BSP shards: a crashed worker's round waits for ps.worker_timeout_s, then goes on without
// it; the worker comes back at a round boundary, its partial round dropped. Preempted and new
// workers join at round boundaries too.
TEST(SimChurn, DilocoOnBspShardsWaitsForTheTimeoutThenGoesOnAndRejoinsAtRounds) {
  test::TempDir d;
  Job ref = elastic_job(d, "bsp", 5);
  run_simulation(ref.run, ref.ps, ref.sim, d.str("ref"), false);
  Job j = ref;
  j.sim.churn = "kill9@0.75:1:1.0,join@1.1:3,sigterm@1.6:0:0.2";  // worker 1 is back after the timeout
  run_simulation(j.run, j.ps, j.sim, d.str("a"), false);
  const Logged l = logged(d.str("a"), 4, 5);
  EXPECT_EQ(l.joined, 3);
  const std::set<int64_t> distinct(l.positions.begin(), l.positions.end());
  EXPECT_EQ(distinct.size(), l.positions.size()) << "a sample granted twice";
  for (const auto& [r, steps] : l.steps) EXPECT_EQ(steps.back(), 30) << "worker " << r;
  for (int r : {1, 3}) {  // joins at a round boundary
    int joined_at = -1;
    for (const auto& m : test::read_jsonl(d.str("a/node" + std::to_string(r) + "/metrics.jsonl")))
      if (m.contains("joined_at_step")) joined_at = m["joined_at_step"].get<int>();
    EXPECT_EQ(joined_at % 5, 0) << "worker " << r;
  }
  for (const auto& [r, steps] : l.steps)  // a step is logged again only where a partial round was redone
    for (size_t i = 1; i < steps.size(); ++i)
      if (steps[i] <= steps[i - 1]) EXPECT_EQ(steps[i] % 5, 1) << "worker " << r << " went back mid-round";
  const auto m = sim_json(d.str("a"))["membership"];
  EXPECT_EQ(m["events_applied"].get<int>(), 3);
  EXPECT_GT(m["lost_steps"]["partial_rounds"].get<int>(), 0);
  // The events' clock starts when every first worker has logged its first step.
  double t0 = 0;
  for (int r = 0; r < 3; ++r) t0 = std::max(t0, steps_of(d.str("a/node" + std::to_string(r) + "/metrics.jsonl"))[0]["time_s"].get<double>());
  const double kill = t0 + 0.75;
  EXPECT_DOUBLE_EQ(sim_json(d.str("a"))["membership"]["events"][0]["at_s"].get<double>(), kill);
  // The round the crashed worker was in waited for the timeout: the shards last heard of worker 1 at its
  // heartbeat at 1 s (after its round's push at 0.7 s), and count it out at their first silence check
  // (every 0.2 s from the kill) past 1 s + ps.worker_timeout_s; worker 0's push of the round was held until then.
  const double beat = std::floor(kill);
  bool waited = false;
  for (const auto& s : steps_of(d.str("a/node0/metrics.jsonl"))) {
    const double at = s["time_s"].get<double>();
    waited |= at > beat + 0.5 && at <= beat + 0.5 + 0.2 + 0.01 && s["step_s"].get<double>() > 0.3;
  }
  EXPECT_TRUE(waited);
  double longest = 0, ref_longest = 0;
  for (const auto& s : steps_of(d.str("a/node0/metrics.jsonl"))) longest = std::max(longest, s["step_s"].get<double>());
  EXPECT_GT(longest, 0.2);
  for (const auto& s : steps_of(d.str("ref/node0/metrics.jsonl"))) ref_longest = std::max(ref_longest, s["step_s"].get<double>());
  EXPECT_LT(ref_longest, 0.3);
  EXPECT_GT(sim_json(d.str("ref"))["membership"]["goodput"].get<double>(), m["goodput"].get<double>());
}

// A signal reaches a process whatever it is doing: a joiner killed while it starts (before its join)
// loses no step, comes back after its delay and joins then; a SIGTERM to a worker joining takes effect
// after its first step.
TEST(SimChurn, AKillWhileStartingLosesNoStepAndTheWorkerJoinsLater) {
  test::TempDir d;
  Job j = elastic_job(d, "asp");
  j.sim.restart_s = 0.3;
  j.sim.churn = "join@0.5:3,kill9@0.6:3:0.2,sigterm@1.7:3:0.2";  // killed 0.1 s into its 0.3 s start-up
  run_simulation(j.run, j.ps, j.sim, d.str("a"), false);
  const auto m = sim_json(d.str("a"))["membership"];
  EXPECT_EQ(m["events_applied"].get<int>(), 3);
  EXPECT_EQ(m["events"][1]["state"].get<std::string>(), "starting");
  EXPECT_EQ(m["lost_steps"]["in_flight"].get<int>(), 0);
  EXPECT_EQ(m["launches"].get<int>(), 3);  // the joiner, its restart, and its return after the SIGTERM
  EXPECT_EQ(m["joins"].get<int>(), 2);     // its first process never joined
  const Logged l = logged(d.str("a"), 4);
  EXPECT_EQ(l.joined, 2);
  EXPECT_EQ(l.steps.at(3).back(), 30);
  const std::set<int64_t> distinct(l.positions.begin(), l.positions.end());
  EXPECT_EQ(distinct.size(), l.positions.size());
  // Its first join came 0.2 s after the kill plus the 0.3 s restart: not before the kill's delay.
  double joined_at = -1;
  for (const auto& r : test::read_jsonl(d.str("a/node3/metrics.jsonl")))
    if (r.contains("joined_at_step")) { joined_at = r["time_s"].get<double>(); break; }
  const double asked = m["events"][1]["at_s"].get<double>() + 0.2 + 0.3;  // its INIT; the replies take their links' time
  EXPECT_GE(joined_at, asked);
  EXPECT_LT(joined_at, asked + 0.01);
}

// Per-step BSP with a backup worker and asynchronous local SGD (delayed Nesterov over the live
// members): the same events, the job completes, every sample once.
TEST(SimChurn, BspWithABackupAndAsyncLocalSgdComplete) {
  test::TempDir d;
  Job bsp = elastic_job(d, "bsp");
  bsp.ps.backup_workers = 1;
  bsp.sim.churn = "kill9@0.6:1:0.4,join@1.1:3,sigterm@1.5:2:0.3";
  run_simulation(bsp.run, bsp.ps, bsp.sim, d.str("bsp"), false);
  Job als = elastic_job(d, "asp", 5);
  als.sim.churn = bsp.sim.churn;
  run_simulation(als.run, als.ps, als.sim, d.str("als"), false);
  for (const char* out : {"bsp", "als"}) {
    const Logged l = logged(d.str(out), 4, std::string(out) == "als" ? 5 : 1);
    EXPECT_EQ(l.joined, 3) << out;
    const std::set<int64_t> distinct(l.positions.begin(), l.positions.end());
    EXPECT_EQ(distinct.size(), l.positions.size()) << out;
    EXPECT_EQ(sim_json(d.str(out))["membership"]["events_applied"].get<int>(), 3) << out;
    const double g = sim_json(d.str(out))["membership"]["goodput"].get<double>();
    EXPECT_GT(g, 0.5) << out;
    EXPECT_LT(g, 0.99) << out;  // three events in a 3 s job cost more than 1%
  }
}
