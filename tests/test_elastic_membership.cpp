// Elastic membership of parameter-server jobs (dist.elastic; issue 30): the shard's join protocol,
// its data grants and their checkpoint, then real servers and workers where a node joins a
// running BSP job and another is preempted with SIGTERM.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "server/parameter_shard.h"
#include "test_helpers.h"
#include "ps_test_messages.h"

namespace syncopate {
namespace {

using test::init_header;
using test::push_header;

MsgHeader elastic_init(int workers, int64_t n) {
  MsgHeader h = init_header(workers, n);
  h.elastic = true;
  h.samples = 4;
  return h;
}
MsgHeader elastic_push(int worker, int64_t clock, int64_t version, int64_t n) {
  MsgHeader h = push_header(worker, clock, version, n);
  h.samples = 4;
  return h;
}
PsConfig config(const std::string& consistency) {
  PsConfig c;
  c.consistency = consistency;
  c.worker_timeout_s = 1000;
  return c;
}

// BSP: a joiner asks while round 0 is being collected and is told round 1 (one round of slack);
// it does not count for round 0, its reply comes with round 0's, and round 1 waits for it.
TEST(ElasticShard, ABspJoinerCountsFromTheNextRoundAndItsReplyComesWithIt) {
  ParameterShard s(config("bsp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(2, 2), init.data(), nullptr, 0);
  EXPECT_TRUE(s.push(elastic_push(0, 0, 0, 2), g.data()).empty());
  EXPECT_FALSE(s.member(2));
  EXPECT_EQ(s.join_clock(2), 1);
  EXPECT_FALSE(s.join_passed(2, 1));
  const int64_t epoch = s.membership_epoch();
  EXPECT_FALSE(s.join(2, 1, 4, 0.0));  // held: it counts from round 1
  EXPECT_EQ(s.live_workers(), 2);
  EXPECT_THROW(s.push(elastic_push(2, 1, 0, 2), g.data()), Error);  // not before its join took effect
  EXPECT_EQ(s.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1, 2}));  // round 0, and the joiner
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.membership_epoch(), epoch + 1);
  EXPECT_EQ(s.live_workers(), 3);
  EXPECT_EQ(s.clock(2), 0);  // its next push is clock 1
  EXPECT_TRUE(s.push(elastic_push(0, 1, 1, 2), g.data()).empty());
  EXPECT_TRUE(s.push(elastic_push(1, 1, 1, 2), g.data()).empty());  // round 1 waits for the joiner
  EXPECT_EQ(s.push(elastic_push(2, 1, 1, 2), g.data()), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.version(), 2);
  // A join at a round already passed is answered with a new clock (the worker asks again).
  EXPECT_TRUE(s.join_passed(3, 1));
  EXPECT_THROW(s.join(3, 1, 4, 0.0), Error);
  EXPECT_EQ(s.join_clock(3), 3);
}

// Nobody left to wait for: a held joiner counts at once.
TEST(ElasticShard, AHeldJoinerCountsAtOnceWhenTheLastMemberLeaves) {
  ParameterShard s(config("bsp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(1, 2), init.data(), nullptr, 0);
  EXPECT_EQ(s.push(elastic_push(0, 0, 0, 2), g.data()), (std::vector<int>{0}));
  EXPECT_FALSE(s.join(1, s.join_clock(1), 4, 0.0));
  EXPECT_EQ(s.finish(0), (std::vector<int>{1}));
  EXPECT_TRUE(s.member(1));
  EXPECT_EQ(s.push(elastic_push(1, 2, 1, 2), g.data()), (std::vector<int>{1}));
}

// SSP/ASP: a joiner starts at the slowest live worker's next clock, so it never holds anyone back.
TEST(ElasticShard, AnSspJoinerStartsAtTheSlowestLiveWorkersNextClock) {
  PsConfig c = config("ssp");
  c.staleness_bound = 2;
  ParameterShard s(c);
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(2, 2), init.data(), nullptr, 0);
  for (int64_t k = 0; k < 3; ++k) s.push(elastic_push(0, k, 0, 2), g.data());
  s.push(elastic_push(1, 0, 0, 2), g.data());
  EXPECT_EQ(s.join_clock(5), 1);  // worker 1, the slowest, pushes clock 1 next
  EXPECT_TRUE(s.join(5, 1, 4, 0.0));
  EXPECT_EQ(s.clock(5), 0);
  EXPECT_EQ(s.live_workers(), 3);
  EXPECT_EQ(s.join_clock(0), 3);  // a member is told its own next clock
}

// The data order: every step's grant is fresh, a resent push keeps the grant it got, a worker that
// leaves and joins again keeps the grant it never used; no sample is granted twice and none skipped.
TEST(ElasticShard, DataGrantsCoverEverySampleOnceAcrossJoinsResendsAndLeaves) {
  ParameterShard s(config("asp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  MsgHeader h = elastic_init(2, 2);
  s.init(h, init.data(), nullptr, 0);
  std::vector<int64_t> granted;
  auto take = [&](int w) { granted.push_back(s.grant(w)); };
  s.register_samples(0, 4), take(0);
  s.register_samples(1, 4), take(1);
  s.register_samples(0, 4);  // a second INIT of worker 0 (resent): the same grant
  EXPECT_EQ(s.grant(0), 0);
  s.push(elastic_push(0, 0, 0, 2), g.data()), take(0);
  s.push(elastic_push(0, 0, 0, 2), g.data());  // resent: a duplicate, the same grant
  EXPECT_EQ(s.grant(0), granted.back());
  s.join(7, s.join_clock(7), 4, 0.0), take(7);
  const int64_t unused = s.grant(1);
  s.finish(1);                                // leaves with a grant it never used
  s.join(1, s.join_clock(1), 4, 0.0);         // and comes back: it uses that one
  EXPECT_EQ(s.grant(1), unused);
  s.push(elastic_push(1, 1, 0, 2), g.data()), take(1);
  s.push(elastic_push(7, 1, 0, 2), g.data()), take(7);
  std::sort(granted.begin(), granted.end());
  for (size_t i = 0; i < granted.size(); ++i) EXPECT_EQ(granted[i], static_cast<int64_t>(4 * i)) << i;
  EXPECT_EQ(s.data_cursor(), static_cast<int64_t>(4 * granted.size()));
  // Only the job's first part grants data.
  ParameterShard second(config("asp"));
  MsgHeader h2 = elastic_init(2, 2);
  h2.offset = 2;
  second.init(h2, init.data(), nullptr, 0);
  second.register_samples(0, 4);
  EXPECT_EQ(second.grant(0), -1);
}

TEST(ElasticShard, MembershipJoinersAndGrantsSurviveACheckpoint) {
  test::TempDir d;
  ParameterShard s(config("bsp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(2, 2), init.data(), nullptr, 0);
  s.register_samples(0, 4);
  s.register_samples(1, 4);
  s.push(elastic_push(0, 0, 0, 2), g.data());
  EXPECT_FALSE(s.join(4, s.join_clock(4), 4, 0.0));
  s.save(d.str("shard.safetensors"));
  ParameterShard r(config("bsp"));
  ASSERT_TRUE(r.load(d.str("shard.safetensors"), 0.0));
  EXPECT_TRUE(r.elastic());
  EXPECT_EQ(r.data_cursor(), s.data_cursor());
  for (int w : {0, 1, 4}) EXPECT_EQ(r.grant(w), s.grant(w)) << w;
  EXPECT_EQ(r.membership_epoch(), s.membership_epoch());
  EXPECT_FALSE(r.member(4));
  EXPECT_EQ(r.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1, 4}));  // the held joiner too
  EXPECT_TRUE(r.member(4));
}

TEST(ElasticShard, AJoinToAJobWithAFixedMembershipIsRefusedByName) {
  ParameterShard s(config("bsp"));
  std::vector<float> init(2, 0.0f);
  s.init(init_header(2, 2), init.data(), nullptr, 0);
  MsgHeader j = init_header(3, 2);
  j.worker = 2;
  j.join = 2;
  EXPECT_NE(test::error_of([&] { s.check_init(j, init.data()); }).find("dist.elastic"), std::string::npos);
  j.elastic = true;
  EXPECT_NE(test::error_of([&] { s.check_init(j, init.data()); }).find("dist.elastic"), std::string::npos);
  EXPECT_THROW(s.join(2, 0, 4, 0.0), Error);
}

// Real servers and workers: two nodes start a BSP job; a third joins while it runs (at the job's
// clock, with the servers' weights); then node 1 gets SIGTERM, stops at a step boundary, writes
// a checkpoint and leaves, and the others go on at once (the servers' worker timeout, 60 s, is
// never what lets them). Every step's data was granted by the servers: no sample is used twice.
TEST(PsElastic, ANodeJoinsARunningBspJobAndAPreemptedOneLeaves) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::string bin = test::bin_dir();
  std::vector<std::unique_ptr<test::Process>> servers;
  std::string eps;
  for (int k = 0; k < 2; ++k) {
    const test::ServerPort port = test::any_server_port(d);
    std::vector<std::string> a = {bin + "/syncopate-server", "--server.shard=" + std::to_string(k), "--ps.consistency=bsp",
                                  "--ps.worker_timeout_s=60"};
    a.insert(a.end(), port.args.begin(), port.args.end());
    servers.push_back(std::make_unique<test::Process>(a, std::vector<std::string>{"SYNCOPATE_TOKEN=t"},
                                                      d.str(fmt::format("server{}.log", k))));
    eps += (k ? "," : "") + test::wait_for_line(port.endpoint_file, 60, servers.back().get());
  }
  constexpr int kSteps = 150;
  auto node = [&](int rank, int nnodes) {
    const std::string out = d.str(fmt::format("w{}", rank));
    std::vector<std::string> a = {bin + "/syncopate-worker", "--out", out, "--model.n_embd=32", "--model.n_head=2",
                                  "--model.block_size=32", "--train.threads=1", "--schedule.warmup_steps=2",
                                  "--eval.every=0", "--eval.batches=1", "--eval.sample_tokens=0", "--checkpoint.every=0",
                                  "--data.corpus=" + corpus, "--data.cache_dir=" + d.str("cache"),
                                  "--train.steps=" + std::to_string(kSteps), "--train.batch_size=2",
                                  "--emulate.step_time_s=0.1", "--dist.mode=ps", "--dist.elastic=true",
                                  "--dist.servers=" + eps, "--dist.timeout_s=60", "--train.preempt_grace_s=30"};
    return std::make_unique<test::Process>(
        a, std::vector<std::string>{"SYNCOPATE_TOKEN=t", fmt::format("NNODES={}", nnodes), fmt::format("NODE_RANK={}", rank)},
        d.str(fmt::format("w{}.log", rank)));
  };
  auto w0 = node(0, 2), w1 = node(1, 2);
  ASSERT_TRUE(test::wait_for_step(d.str("w0"), 5, 120)) << test::slurp(d.str("w0.log"));
  auto w2 = node(2, 3);
  // The joiner's first steps are past the job's clock: wait for three of them, whatever their numbers.
  auto logged_steps = [&](const std::string& out) {
    int n = 0;
    std::istringstream lines(test::slurp(out + "/metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {  // a line still being written does not parse: skipped
      const auto m = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      n += m.is_object() && m.contains("loss");
    }
    return n;
  };
  for (int i = 0; i < 6000 && logged_steps(d.str("w2")) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(logged_steps(d.str("w2")), 3) << test::slurp(d.str("w2.log")) << test::slurp(d.str("server0.log"));
  const auto t_term = std::chrono::steady_clock::now();
  ::kill(w1->pid(), SIGTERM);
  EXPECT_EQ(w1->wait(30), 0) << test::slurp(d.str("w1.log"));
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_term).count();
  EXPECT_LT(stop_s, 10) << "a preempted node stops at its next step boundary";
  EXPECT_EQ(w0->wait(120), 0) << test::slurp(d.str("w0.log"));
  EXPECT_EQ(w2->wait(120), 0) << test::slurp(d.str("w2.log"));
  const std::string log1 = test::slurp(d.str("w1.log")), log2 = test::slurp(d.str("w2.log"));
  EXPECT_NE(log1.find("SIGTERM"), std::string::npos) << log1;
  EXPECT_NE(log2.find("joined the running job at step"), std::string::npos) << log2;

  // Per node: its steps (metrics) and the data each took.
  std::map<int, std::vector<nlohmann::json>> steps;
  for (int r = 0; r < 3; ++r)
    for (const auto& m : test::read_jsonl(d.str(fmt::format("w{}/metrics.jsonl", r))))
      if (m.contains("loss")) steps[r].push_back(m);
  ASSERT_FALSE(steps[2].empty());
  const int64_t joined = steps[2].front().at("step").get<int64_t>() - 1;
  EXPECT_GT(joined, 5) << "the joiner starts at the job's clock, not at 0";
  EXPECT_EQ(steps[0].back().at("step"), kSteps);
  EXPECT_EQ(steps[2].back().at("step"), kSteps);
  const int64_t left_at = steps[1].back().at("step").get<int64_t>();
  EXPECT_LT(left_at, kSteps);
  EXPECT_TRUE(std::filesystem::exists(d.str(fmt::format("w1/checkpoints/step_{:06d}", left_at)))) << "preempted: checkpointed";
  // After node 1 left, no node waited for it: no step of the others took as long as a timeout.
  for (int r : {0, 2})
    for (const auto& m : steps[r]) EXPECT_LT(m.at("step_s").get<double>(), 10.0) << "node " << r << " step " << m.at("step");
  // Each step took 2 samples the servers granted: none twice; the only samples granted and never
  // used are each node's last grant (for a step after its last).
  std::vector<int64_t> used;
  for (auto& [r, ms] : steps)
    for (const auto& m : ms) used.push_back(m.at("data_position").get<int64_t>());
  std::sort(used.begin(), used.end());
  EXPECT_EQ(std::adjacent_find(used.begin(), used.end()), used.end()) << "a sample granted twice";
  int gaps = 0;
  for (size_t i = 0; i < used.size(); ++i) {
    EXPECT_EQ(used[i] % 2, 0);
    if (i > 0 && used[i] != used[i - 1] + 2) gaps += static_cast<int>((used[i] - used[i - 1]) / 2 - 1);
  }
  EXPECT_EQ(used.front(), 0);
  EXPECT_LE(gaps, 3) << "skipped samples beyond the nodes' last grants";
  // The servers saw the join and the leave.
  const std::string s0 = test::slurp(d.str("server0.log"));
  EXPECT_NE(s0.find("worker 2 joins"), std::string::npos) << s0;
  EXPECT_NE(s0.find("worker 1 finished"), std::string::npos) << s0;
}

}  // namespace
}  // namespace syncopate
