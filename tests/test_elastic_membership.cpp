// Elastic membership of parameter-server jobs (dist.elastic; issue 30): the shard's join protocol,
// its data grants and their checkpoint, then real servers and workers where a node joins a
// running BSP job and another is preempted with SIGTERM, per step and with local SGD.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <future>

#include <torch/torch.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/check.h"
#include "server/parameter_shard.h"
#include "server/ps_client.h"
#include "test_helpers.h"
#include "ps_in_process_server.h"
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

// The real-process tests' pieces. Two BSP server shards (with `extra` flags) started into
// `servers`; returns their endpoints as --dist.servers takes them.
std::string start_bsp_shards(const test::TempDir& d, const std::vector<std::string>& extra,
                             std::vector<std::unique_ptr<test::Process>>& servers) {
  std::string eps;
  for (int k = 0; k < 2; ++k) {
    const test::ServerPort port = test::any_server_port(d);
    std::vector<std::string> a = {test::bin_dir() + "/syncopate-server", "--server.shard=" + std::to_string(k),
                                  "--ps.consistency=bsp", "--server.exit_when_done=true"};
    for (const std::string& x : extra) a.push_back(fmt::format(fmt::runtime(x), k));  // "{}": the shard's index
    a.insert(a.end(), port.args.begin(), port.args.end());
    servers.push_back(std::make_unique<test::Process>(a, std::vector<std::string>{"SYNCOPATE_TOKEN=t"},
                                                      d.str(fmt::format("server{}.log", k))));
    eps += (k ? "," : "") + test::wait_for_line(port.endpoint_file, 60, servers.back().get());
  }
  return eps;
}
// An elastic ps node of the tiny model (out w<rank>, log w<rank>.log) with `extra` flags.
std::unique_ptr<test::Process> elastic_node(const test::TempDir& d, const std::string& corpus, const std::string& eps,
                                            int rank, int nnodes, int steps, std::vector<std::string> extra,
                                            const std::string& token = "t") {
  std::vector<std::string> a = {test::bin_dir() + "/syncopate-worker", "--out", d.str(fmt::format("w{}", rank)),
                                "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32", "--train.threads=1",
                                "--schedule.warmup_steps=2", "--eval.every=0", "--eval.batches=1",
                                "--eval.sample_tokens=0", "--data.corpus=" + corpus, "--data.cache_dir=" + d.str("cache"),
                                "--train.steps=" + std::to_string(steps), "--emulate.step_time_s=0.1", "--dist.mode=ps",
                                "--dist.elastic=true", "--dist.servers=" + eps, "--dist.timeout_s=60",
                                "--train.preempt_grace_s=30"};
  a.insert(a.end(), extra.begin(), extra.end());
  return std::make_unique<test::Process>(
      a, std::vector<std::string>{"SYNCOPATE_TOKEN=" + token, fmt::format("NNODES={}", nnodes), fmt::format("NODE_RANK={}", rank)},
      d.str(fmt::format("w{}.log", rank)));
}
// A run's step records, the last of each step (a node back with --resume appends to its file); a
// line still being written does not parse and is skipped.
std::map<int64_t, nlohmann::json> step_records(const std::string& out) {
  std::map<int64_t, nlohmann::json> by_step;
  std::istringstream lines(test::slurp(out + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto m = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (m.is_object() && m.contains("loss")) by_step[m.at("step").get<int64_t>()] = m;
  }
  return by_step;
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
  const int64_t epoch = s.membership_epoch();
  EXPECT_FALSE(s.join(2, 1, 4, 0.0));  // held: it counts from round 1
  EXPECT_EQ(s.live_workers(), 2);
  EXPECT_EQ(s.round(), 0);  // protocol 9's frontier: the held joiner's clock is not one closed here (helper-34)
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
  // A join at a clock this part's rounds passed (while the worker asked the other parts) counts it
  // from the round being collected, at once: never refused.
  EXPECT_TRUE(s.join(3, 1, 4, 0.0));
  EXPECT_EQ(s.clock(3), 1);  // its push of clock 1 is answered as a duplicate, clock 2 counts
  const int64_t for_clock_1 = s.grant(3);
  EXPECT_EQ(s.push(elastic_push(3, 1, 2, 2), g.data()), (std::vector<int>{3}));
  EXPECT_EQ(s.version(), 2);
  // That duplicate took its grant (it computed clock 1 on those samples): clock 2 gets fresh ones,
  // and a resend of the duplicate keeps them (the suite's PsElastic runs once took a sample twice).
  const int64_t for_clock_2 = s.grant(3);
  EXPECT_GT(for_clock_2, for_clock_1);
  s.push(elastic_push(3, 1, 2, 2), g.data());
  EXPECT_EQ(s.grant(3), for_clock_2);
}

// The skeptic's deadlock (helper-19): a join whose clock one part's rounds passed while the other
// part admitted the joiner. Two parts (two shards of one server list), workers 0 and 1, then
// joiner 2. Every worker pushes each clock to both parts; nothing may wait for something that
// waits for it.
TEST(ElasticShard, AJoinThatOnePartsRoundsPassedNeverDeadlocksTheParts) {
  ParameterShard a(config("bsp")), b(config("bsp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  MsgHeader ha = elastic_init(2, 2), hb = elastic_init(2, 2);
  hb.offset = 2;
  a.init(ha, init.data(), nullptr, 0);
  b.init(hb, init.data(), nullptr, 0);
  auto push = [&](ParameterShard& p, int w, int64_t c) {
    MsgHeader h = elastic_push(w, c, 0, 2);
    h.offset = p.offset();
    return p.push(h, g.data());
  };
  for (int w = 0; w < 2; ++w) push(a, w, 0), push(b, w, 0);
  // The joiner asks both parts while round 1 is collected everywhere: both say clock 2.
  push(a, 0, 1), push(b, 0, 1);
  const int64_t k = std::max(a.join_clock(2), b.join_clock(2));
  EXPECT_EQ(k, 2);
  // Before its join arrives: round 1 completes on both, and round 2 on b (worker 1's push of 2 to a
  // is still on its way).
  push(a, 1, 1), push(b, 1, 1);
  push(a, 0, 2), push(b, 0, 2), push(b, 1, 2);
  EXPECT_EQ(b.version(), 3);
  EXPECT_TRUE(a.join(2, k, 4, 0.0));  // a collects round 2: it counts the joiner from there
  EXPECT_TRUE(b.join(2, k, 4, 0.0));  // b collects round 3: from there (its push of 2 is a duplicate)
  // The joiner's clock 2: counted on a, answered at once on b.
  EXPECT_TRUE(push(a, 2, 2).empty());                    // a's round 2 still waits for worker 1
  EXPECT_EQ(push(b, 2, 2), (std::vector<int>{2}));       // at once
  EXPECT_EQ(push(a, 1, 2), (std::vector<int>{0, 1, 2}));  // a's round 2 complete
  // Round 3 counts all three on both parts.
  for (int w = 0; w < 3; ++w) {
    const auto ra = push(a, w, 3), rb = push(b, w, 3);
    EXPECT_EQ(ra.size(), w == 2 ? 3u : 0u) << w;
    EXPECT_EQ(rb.size(), w == 2 ? 3u : 0u) << w;
  }
  EXPECT_EQ(a.version(), 4);
  EXPECT_EQ(b.version(), 4);
}

// A heartbeat of a node that comes back (its process restarted) does not make it a member again at
// its old clock: it asks where the job is and joins there.
TEST(ElasticShard, AHeartbeatDoesNotBringAnExpiredWorkerBackAtItsOldClock) {
  PsConfig c = config("bsp");
  c.worker_timeout_s = 5;
  ParameterShard s(c);
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(2, 2), init.data(), nullptr, 0);
  for (int w = 0; w < 2; ++w) s.seen(w, 0.0);
  s.push(elastic_push(0, 0, 0, 2), g.data(), 1.0);
  EXPECT_EQ(s.expire(6.0), (std::vector<int>{0}));  // worker 1 silent: round 0 without it
  for (int64_t k = 1; k < 4; ++k) s.push(elastic_push(0, k, k, 2), g.data(), 6.0);
  s.seen(1, 7.0);  // its restarted process's first heartbeat
  EXPECT_FALSE(s.member(1));
  EXPECT_EQ(s.live_workers(), 1);
  EXPECT_EQ(s.join_clock(1), 5);  // the job's round 4 and one of slack, not its clock 0
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

// BSP with backup workers while the job is short of workers (found by experiments/churn.py: 146-150
// updates for 120 clocks): 3 workers with 1 backup aggregate 2 gradients per round; with one of
// them gone a round still takes both of the others', not the first push alone; with a joiner (4
// live) it takes 3 (one backup, as configured).
TEST(ElasticShard, BackupWorkersAreUsedUpFirstWhileWorkersAreMissing) {
  PsConfig c = config("bsp");
  c.backup_workers = 1;
  c.worker_timeout_s = 5;
  ParameterShard s(c);
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(3, 2), init.data(), nullptr, 0);
  EXPECT_TRUE(s.push(elastic_push(0, 0, 0, 2), g.data()).empty());
  EXPECT_EQ(s.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1}));  // 2 of 3
  s.finish(2);  // worker 2 leaves: 2 live
  EXPECT_TRUE(s.push(elastic_push(0, 1, 1, 2), g.data()).empty()) << "one push is not a round";
  EXPECT_EQ(s.push(elastic_push(1, 1, 1, 2), g.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(s.version(), 2);
  EXPECT_FALSE(s.join(3, s.join_clock(3), 4, 0.0));  // counts from round 3
  EXPECT_TRUE(s.push(elastic_push(0, 2, 2, 2), g.data()).empty());
  EXPECT_EQ(s.push(elastic_push(1, 2, 2, 2), g.data()), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(s.live_workers(), 3);
  EXPECT_TRUE(s.push(elastic_push(3, 3, 3, 2), g.data()).empty());
  EXPECT_EQ(s.push(elastic_push(0, 3, 3, 2), g.data()), (std::vector<int>{0, 3}));  // 3 live - 1 backup
  EXPECT_EQ(s.version(), 4);
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
// A BSP member that asks where to start has restarted (a running worker never asks): unless its push
// is held in the round, it is told the round after the one being collected, and its join counts it
// out of that round at once, which completes the round for the others (their replies released), so
// nobody waits for its restart and a local SGD round to be done again (helper-27).
TEST(ElasticShard, ARestartedBspMemberLeavesItsRoundAndJoinsTheNext) {
  ParameterShard s(config("bsp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(2, 2), init.data(), nullptr, 0);
  EXPECT_TRUE(s.join(0, 0, 4, 0.0));
  EXPECT_TRUE(s.join(1, 0, 4, 0.0));
  EXPECT_TRUE(s.push(elastic_push(0, 0, 0, 2), g.data()).empty());
  EXPECT_EQ(s.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1}));
  EXPECT_TRUE(s.push(elastic_push(0, 1, 1, 2), g.data()).empty());  // round 1 waits for worker 1
  EXPECT_EQ(s.join_clock(0), 2);  // a member held in the round: its own next clock
  EXPECT_EQ(s.join_clock(1), 2);  // worker 1 restarted: the round after round 1, not its own clock 1
  std::vector<int> released;
  EXPECT_TRUE(s.join(1, 2, 4, 0.0, &released));  // round 1 completes without it; it counts from round 2
  EXPECT_EQ(released, (std::vector<int>{0}));
  EXPECT_EQ(s.version(), 2);
  EXPECT_EQ(s.clock(1), 1);
  EXPECT_TRUE(s.push(elastic_push(0, 2, 2, 2), g.data()).empty());  // round 2 counts it again
  EXPECT_EQ(s.push(elastic_push(1, 2, 2, 2), g.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(s.version(), 3);
  // The whole job restarting together, nobody in round 3 yet: each is told its own next clock and
  // round 3 is collected from both (counting each out would skip it; helper-28).
  EXPECT_EQ(s.join_clock(0), 3);
  EXPECT_EQ(s.join_clock(1), 3);
  EXPECT_TRUE(s.join(0, 3, 4, 0.0));
  EXPECT_TRUE(s.join(1, 3, 4, 0.0));
  EXPECT_TRUE(s.push(elastic_push(0, 3, 3, 2), g.data()).empty());
  EXPECT_EQ(s.push(elastic_push(1, 3, 3, 2), g.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(s.version(), 4);
  // The job's first workers, live from the first INIT before they join, all start at round 0
  // (before the restart rule learnt this, the first to ask was held for round 1 and round 0 could
  // be skipped: the suite's PsElastic run applied 149 updates for 150 rounds).
  ParameterShard fresh(config("bsp"));
  fresh.init(elastic_init(2, 2), init.data(), nullptr, 0);
  EXPECT_EQ(fresh.join_clock(0), 0);
  EXPECT_EQ(fresh.join_clock(1), 0);
  EXPECT_TRUE(fresh.join(0, 0, 4, 0.0));
  EXPECT_TRUE(fresh.join(1, 0, 4, 0.0));
  EXPECT_TRUE(fresh.push(elastic_push(0, 0, 0, 2), g.data()).empty());  // round 0 waits for both
  EXPECT_EQ(fresh.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1}));
  // A job's only member restarting is told its own next clock (nobody else to go on).
  ParameterShard one(config("bsp"));
  one.init(elastic_init(1, 2), init.data(), nullptr, 0);
  EXPECT_TRUE(one.join(0, one.join_clock(0), 4, 0.0));
  EXPECT_EQ(one.push(elastic_push(0, 0, 0, 2), g.data()), (std::vector<int>{0}));
  EXPECT_EQ(one.join_clock(0), 1);
}

// helper-28's first gap (protocol 10): a worker whose push of clock 1 reached another part but not
// the first, then died, had used its grant for clock 1. Back, its join says so (`pushed`, the newest
// clock any part received from it): the first part gives it fresh samples, or those would be
// trained on twice. A worker whose newest push anywhere is older than its grant's clock never used
// the grant: it keeps it, and no window is skipped.
TEST(ElasticShard, AReturningWorkersGrantIsReplacedOnlyWhereAPartReceivedItsClock) {
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  for (const bool used : {true, false}) {
    SCOPED_TRACE(used ? "its push of clock 1 reached another part" : "it pushed nothing of clock 1");
    ParameterShard s(config("bsp"));
    s.init(elastic_init(2, 2), init.data(), nullptr, 0);
    EXPECT_TRUE(s.join(0, 0, 4, 0.0));
    EXPECT_TRUE(s.join(1, 0, 4, 0.0));
    EXPECT_TRUE(s.push(elastic_push(0, 0, 0, 2), g.data()).empty());
    EXPECT_EQ(s.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1}));
    const int64_t grant = s.grant(1);  // worker 1's data for clock 1
    EXPECT_TRUE(s.push(elastic_push(0, 1, 1, 2), g.data()).empty());  // round 1 waits for worker 1
    EXPECT_EQ(s.pushed_clock(1), 0);  // this part's own answer to a join = 1
    EXPECT_EQ(s.pushed_clock(9), -1);  // a worker it never had
    const int64_t cursor = s.data_cursor();
    EXPECT_EQ(s.join_clock(1), 2);  // restarted: the round after the one being collected
    std::vector<int> released;
    EXPECT_TRUE(s.join(1, 2, 4, 0.0, &released, used ? 1 : 0));
    EXPECT_EQ(released, (std::vector<int>{0}));
    if (used) {
      EXPECT_EQ(s.grant(1), cursor);  // the next samples not granted yet
      EXPECT_EQ(s.data_cursor(), cursor + 4);
    } else {
      EXPECT_EQ(s.grant(1), grant);  // kept: nothing skipped
      EXPECT_EQ(s.data_cursor(), cursor);
    }
    const int64_t now = s.grant(1);
    s.join(1, 2, 4, 0.0, nullptr, used ? 1 : 0);  // a resent join: the same grant
    EXPECT_EQ(s.grant(1), now);
  }
}

// helper-28's second gap (protocol 11). Worker 0's push of round 0 reached parts A and B; B completed
// round 0, A still waits for worker 1's push (A restarted and worker 1's resend is slow); worker 0
// dies, and B, silent from it past its timeout, expires it. Worker 0 restarted: A says clock 1 (its
// push is held there), B round 2 (a joiner: the round after the one being collected). On A the held
// push must be released with round 0 before the join takes effect there: A then counts worker 0 from
// round 2 as B does, and both apply the same gradients in the same rounds. Before, A raised its clock
// to 1 inside round 0, and A's round 1 waited for worker 0 and took its gradient of round 2.
TEST(ElasticShard, ARestartedMembersJoinWaitsForItsPushHeldOnAPartBehind) {
  test::TempDir d;
  std::vector<float> init(2, 0.0f);
  auto grad = [](int w, int64_t c) { return std::vector<float>{1.0f + static_cast<float>(w), 0.5f * static_cast<float>(c)}; };
  auto push = [&](ParameterShard& s, int w, int64_t c) {
    const std::vector<float> g = grad(w, c);
    return s.push(elastic_push(w, c, 0, 2), g.data());
  };
  ParameterShard a(config("bsp")), b(config("bsp"));
  for (ParameterShard* s : {&a, &b}) {
    s->init(elastic_init(2, 2), init.data(), nullptr, 0);
    EXPECT_TRUE(s->join(0, 0, 4, 0.0));
    EXPECT_TRUE(s->join(1, 0, 4, 0.0));
  }
  EXPECT_TRUE(push(b, 0, 0).empty());
  EXPECT_EQ(push(b, 1, 0), (std::vector<int>{0, 1}));
  EXPECT_TRUE(push(a, 0, 0).empty());  // A's round 0 waits for worker 1; worker 0 dies here
  b.seen(1, 1050.0);
  EXPECT_TRUE(b.expire(1100.0).empty());  // worker 0 silent for 1100 s > the 1000 s timeout
  EXPECT_FALSE(b.member(0));
  // Worker 0 restarted asks both parts (join = 1) and joins at the largest answer (join = 2).
  EXPECT_EQ(a.join_clock(0), 1);  // its push is held here
  EXPECT_EQ(b.join_clock(0), 2);
  EXPECT_FALSE(a.join(0, 2, 4, 1100.0, nullptr, 0));  // waits for its held push's round
  EXPECT_EQ(a.rejoining(), (std::map<int, int64_t>{{0, 2}}));
  EXPECT_EQ(a.clock(0), 0) << "its clock moved inside the round being collected";
  a.save(d.str("a.safetensors"));
  ParameterShard restored(config("bsp"));  // A restored from that checkpoint must go on the same way
  ASSERT_TRUE(restored.load(d.str("a.safetensors"), 1100.0));
  EXPECT_EQ(restored.rejoining(), a.rejoining());
  EXPECT_FALSE(b.join(0, 2, 4, 1100.0, nullptr, 0));  // B: a joiner counted from round 2
  // A: round 0 completes with both; worker 0's join takes effect: out of round 1, counted from 2.
  for (ParameterShard* s : {&a, &restored}) {
    EXPECT_EQ(push(*s, 1, 0), (std::vector<int>{1})) << "worker 0's reply comes when it is counted, not now";
    EXPECT_TRUE(s->rejoining().empty());
    EXPECT_FALSE(s->member(0));
  }
  for (ParameterShard* s : {&a, &restored, &b}) {
    EXPECT_EQ(push(*s, 1, 1), (std::vector<int>{1, 0})) << "round 1 must not wait for worker 0";
    EXPECT_TRUE(s->member(0));
    EXPECT_EQ(s->version(), 2);
  }
  EXPECT_TRUE(a.params().equal(b.params())) << "the parts applied different gradients in rounds 0 and 1";
  EXPECT_TRUE(restored.params().equal(a.params()));
  for (ParameterShard* s : {&a, &restored, &b}) {  // round 2 with both
    EXPECT_TRUE(push(*s, 0, 2).empty());
    EXPECT_EQ(push(*s, 1, 2), (std::vector<int>{0, 1}));
    EXPECT_EQ(s->version(), 3);
  }
  EXPECT_TRUE(a.params().equal(b.params()));
  EXPECT_TRUE(restored.params().equal(a.params()));
  // A join that names the round right after the held one is not deferred (its clock is the held
  // push's next): its reply comes with the round, as before.
  ParameterShard c(config("bsp"));
  c.init(elastic_init(2, 2), init.data(), nullptr, 0);
  c.join(0, 0, 4, 0.0), c.join(1, 0, 4, 0.0);
  EXPECT_TRUE(push(c, 0, 0).empty());
  EXPECT_FALSE(c.join(0, 1, 4, 0.0, nullptr, 0));
  EXPECT_TRUE(c.rejoining().empty());
  EXPECT_EQ(push(c, 1, 0), (std::vector<int>{0, 1}));
}

// A hand-made request of job "job" on a raw DEALER: the header frame, then the values if any.
void send_request(zmq::socket_t& s, MsgHeader h, const std::vector<float>& data) {
  h.token = token_digest("job");
  const std::string hdr = encode_header(h);
  s.send(zmq::buffer(hdr), data.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
  if (!data.empty()) s.send(zmq::buffer(data), zmq::send_flags::none);
}

// The next reply on a raw DEALER, decoded (an empty header if none came).
MsgHeader receive_reply(zmq::socket_t& s) {
  std::vector<zmq::message_t> frames;
  EXPECT_TRUE(zmq::recv_multipart(s, std::back_inserter(frames)));
  return frames.empty() ? MsgHeader{} : decode_reply(frames[0].data(), frames[0].size());
}

// helper-28's third gap (protocol 11). A join = 2 resent while the server was slow to answer gets two
// replies; the second, late one must never be taken for the reply of the worker's first push (its
// clock can be the push's: a part whose rounds passed the join clock counts the worker from its own).
// The server tags replies to a join with join = 2 (a real server, raw requests), and the client takes
// a push's reply only where join = 0 (a real client against a scripted peer on a real socket, which
// sends the late join reply with the push's clock and other values first).
// With background checkpoints (server.checkpoint_background) both replies wait for the write that
// holds the join, and each is still tagged as a join's (helper-18: the tag was decided when the reply
// left, so the resend's went untagged).
TEST(PsElastic, ALateReplyToAResentJoinIsNeverTakenForAPushs) {
  PsConfig pc;
  pc.consistency = "asp";
  for (bool background : {false, true}) {
    SCOPED_TRACE(background ? "background checkpoints" : "no checkpoints");
    test::TempDir d;
    ServerConfig sc;
    sc.encrypt = "off";
    if (background) sc.checkpoint_dir = d.str("ck"), sc.checkpoint_background = true, sc.checkpoint_s = 0.5;
    test::InProcessServer server(sc, pc, "job");
    zmq::context_t ctx;
    zmq::socket_t s = server.dealer(ctx);
    auto request = [&](const MsgHeader& h, const std::vector<float>& data) { send_request(s, h, data); };
    auto reply = [&] { return receive_reply(s); };
    MsgHeader ask = elastic_init(1, 2);
    ask.join = 1;
    request(ask, {1.0f, 1.0f});
    const MsgHeader asked = reply();
    EXPECT_EQ(asked.join, 1);
    MsgHeader join = elastic_init(1, 2);
    join.join = 2;
    join.clock = asked.clock;
    request(join, {});
    request(join, {});  // the resend
    for (int i = 0; i < 2; ++i) {
      const MsgHeader r = reply();
      EXPECT_EQ(r.type, static_cast<int>(MsgType::kOk)) << r.text;
      EXPECT_EQ(r.join, 2) << "reply " << i << " to a join does not say so";
    }
    request(elastic_push(0, asked.clock, 0, 2), {0.5f, 0.5f});
    const MsgHeader pushed = reply();
    EXPECT_EQ(pushed.join, 0);
    EXPECT_EQ(pushed.clock, asked.clock);
  }
  // The client, two parts on one server (one value each): a scripted peer answers its joins only after
  // the resends, then sends late replies to the resends with the pushes' clock and values 7, part 1's
  // first, before the pushes' own (3 and 5). Part 1's must not be kept as its push's reply while the
  // client waits for part 0's.
  zmq::context_t ctx;
  zmq::socket_t peer(ctx, zmq::socket_type::router);
  peer.set(zmq::sockopt::linger, 0);
  peer.set(zmq::sockopt::rcvtimeo, 10000);
  peer.bind("tcp://127.0.0.1:*");
  const std::string ep = peer.get(zmq::sockopt::last_endpoint);
  PsClientOptions o;
  o.timeout_s = 10;
  o.first_resend_s = 0.3;
  o.elastic = true;
  o.samples_per_step = 4;
  o.partition_elems = 1;
  auto run = std::async(std::launch::async, [&] {
    PsClient c({ep}, "job", 0, 1, o);
    at::Tensor params = torch::ones({2});
    c.init(params, {}, AdamWConfig{});
    std::vector<PsTicket> t;
    for (int p = 0; p < 2; ++p) t.push_back(c.push(p, torch::full({1}, 0.5f), 4, 0.1));
    for (int p = 0; p < 2; ++p) {
      at::Tensor part = params.narrow(0, p, 1);
      c.wait(t[static_cast<size_t>(p)], part);
    }
    return params;
  });
  // The client's next request of `type` (heartbeats, once a second, and resent INITs skipped).
  auto take = [&](MsgType type) {
    for (;;) {
      std::vector<zmq::message_t> frames;
      EXPECT_TRUE(zmq::recv_multipart(peer, std::back_inserter(frames)));
      if (frames.size() < 2) return std::pair<zmq::message_t, MsgHeader>{};
      const MsgHeader h = decode_header(frames[1].data(), frames[1].size());
      if (h.type != static_cast<int>(type)) continue;
      return std::make_pair(std::move(frames[0]), h);
    }
  };
  auto answer = [&](const zmq::message_t& id, const MsgHeader& req, int join, int64_t clock, float value) {
    MsgHeader r;
    r.type = static_cast<int>(MsgType::kOk);
    r.worker = 0;
    r.offset = req.offset;
    r.length = req.length;
    r.join = join;
    r.clock = clock;
    const std::string hdr = encode_header(r);
    const std::vector<float> values(static_cast<size_t>(req.length), value);
    peer.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
    peer.send(zmq::buffer(hdr), join == 1 ? zmq::send_flags::none : zmq::send_flags::sndmore);
    if (join != 1) peer.send(zmq::buffer(values), zmq::send_flags::none);
  };
  std::map<int64_t, std::pair<zmq::message_t, MsgHeader>> asks, joins, pushes;  // by part offset
  while (asks.size() < 2) {
    auto m = take(MsgType::kInit);
    EXPECT_EQ(m.second.join, 1);
    asks[m.second.offset] = std::move(m);
  }
  for (auto& [off, m] : asks) answer(m.first, m.second, 1, 4, 0.0f);  // "start at clock 4"
  for (int seen = 0; seen < 4; ++seen) {  // each part's join, then its resend after first_resend_s
    auto m = take(MsgType::kInit);
    EXPECT_EQ(m.second.join, 2);
    EXPECT_EQ(m.second.clock, 4);
    joins[m.second.offset] = std::move(m);
  }
  ASSERT_EQ(joins.size(), 2u);
  for (auto& [off, m] : joins) answer(m.first, m.second, 2, 3, 1.0f);  // the replies to the joins
  while (pushes.size() < 2) {
    auto m = take(MsgType::kPushPull);
    EXPECT_EQ(m.second.clock, 4);
    pushes[m.second.offset] = std::move(m);
  }
  answer(joins[1].first, joins[1].second, 2, 4, 7.0f);  // late replies to the resends, with the pushes' clock
  answer(joins[0].first, joins[0].second, 2, 4, 7.0f);
  answer(pushes[0].first, pushes[0].second, 0, 4, 3.0f);
  answer(pushes[1].first, pushes[1].second, 0, 4, 5.0f);
  ASSERT_EQ(run.wait_for(std::chrono::seconds(15)), std::future_status::ready);
  const at::Tensor got = run.get();
  EXPECT_TRUE(got.equal(torch::tensor({3.0f, 5.0f}))) << "the pushes took values " << got;
}

// Background checkpoints: the membership journal answers an ASP join at once, but under BSP a join's
// outcome depends on the rounds (a joiner counted at once when the rounds passed its clock would be a
// joiner waiting for its round if re-delivered over an older snapshot, and its pushes refused:
// helper-20), so a BSP join's reply still waits for the write of the state that holds it, and nothing
// is recorded.
TEST(PsElastic, UnderBspAJoinStillWaitsForTheWriteOfTheState) {
  for (const std::string consistency : {"asp", "bsp"}) {
    SCOPED_TRACE(consistency);
    PsConfig pc;
    pc.consistency = consistency;
    test::TempDir d;
    ServerConfig sc;
    sc.encrypt = "off";
    sc.checkpoint_dir = d.str("ck"), sc.checkpoint_background = true, sc.checkpoint_s = 0.6;
    test::InProcessServer server(sc, pc, "job");
    zmq::context_t ctx;
    zmq::socket_t s = server.dealer(ctx);
    auto reply = [&] { return receive_reply(s); };
    MsgHeader ask = elastic_init(1, 2);
    ask.join = 1;
    send_request(s, ask, {1.0f, 1.0f});
    const MsgHeader asked = reply();
    // The partition's creation is written first (once, at the job's start): wait for it.
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    MsgHeader join = elastic_init(1, 2);
    join.join = 2;
    join.clock = asked.clock;
    const auto t0 = std::chrono::steady_clock::now();
    send_request(s, join, {});
    const MsgHeader joined = reply();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(joined.type, static_cast<int>(MsgType::kOk)) << joined.text;
    EXPECT_EQ(joined.join, 2);
    const auto stats = [&] {
      MsgHeader q;
      q.type = static_cast<int>(MsgType::kStats);
      send_request(s, q, {});
      return nlohmann::json::parse(reply().text);
    }();
    if (consistency == "asp") {
      EXPECT_LT(waited, 0.4) << "an ASP join waited for a write of the state";
      EXPECT_EQ(stats["membership_records"].get<int64_t>(), 1) << stats.dump();
    } else {
      EXPECT_GE(waited, 0.5) << "a BSP join was answered before a write of the state held it";
      EXPECT_EQ(stats["membership_records"].get<int64_t>(), 0) << stats.dump();
    }
  }
}

// helper-28's second gap (protocol 11) on real servers over real sockets, as the shard test above
// plays it on two ParameterShards: two BSP servers, each one part of the same layout, B expiring a
// silent worker after 1 s and A after 600 s. Worker 0's push of round 0 is applied on B and held on
// A (which waits for worker 1); worker 0 dies, B expires it, and worker 0 comes back (new sockets):
// A answers its ask with its held push's next clock, B with its own; A defers the join = 2 until its
// round 0 is released. Both servers must then apply the same gradients in the same rounds (equal
// values after every round, the parts having started equal), round 1 must not wait for worker 0,
// and worker 0's join replies, tagged join = 2, come with the round it is counted from.
TEST(PsElastic, ARestartedMembersJoinWaitsForItsPushHeldOnAnotherServerBehind) {
  ServerConfig sc;
  sc.encrypt = "off";
  PsConfig slow = config("bsp"), fast = config("bsp");
  slow.worker_timeout_s = 600;
  fast.worker_timeout_s = 2;  // worker 1's heartbeats come every 100 ms: only a stall of 2 s would expire it too
  test::InProcessServer a(sc, slow, "job"), b(sc, fast, "job");
  zmq::context_t ctx;
  auto request = send_request;
  // One reply: its header and its values (empty when it carries none).
  auto reply = [](zmq::socket_t& s) {
    std::vector<zmq::message_t> frames;
    EXPECT_TRUE(zmq::recv_multipart(s, std::back_inserter(frames))) << "no reply within 5 s";
    std::pair<MsgHeader, std::vector<float>> r;
    if (frames.empty()) return r;
    r.first = decode_reply(frames[0].data(), frames[0].size());
    if (frames.size() > 1)
      r.second.assign(frames[1].data<float>(), frames[1].data<float>() + frames[1].size() / sizeof(float));
    return r;
  };
  auto nothing_within = [](zmq::socket_t& s, int ms) {
    return !(zmq::poll(std::vector<zmq::pollitem_t>{{s.handle(), 0, ZMQ_POLLIN, 0}}, std::chrono::milliseconds(ms)) > 0);
  };
  auto grad = [](int w, int64_t c) { return std::vector<float>{1.0f + static_cast<float>(w) + 0.5f * static_cast<float>(c)}; };
  auto push = [&](zmq::socket_t& s, int w, int64_t c) { request(s, elastic_push(w, c, 0, 1), grad(w, c)); };
  // Joins worker w at both servers (ask, then join = 2 at the largest answer); returns the answers.
  auto join_both = [&](zmq::socket_t& sa, zmq::socket_t& sb, int w, bool expect_replies) {
    MsgHeader ask = elastic_init(2, 1);
    ask.worker = w;
    ask.join = 1;
    request(sa, ask, {0.0f});
    request(sb, ask, {0.0f});
    const int64_t ca = reply(sa).first.clock, cb = reply(sb).first.clock;
    MsgHeader join = elastic_init(2, 1);
    join.worker = w;
    join.join = 2;
    join.clock = std::max(ca, cb);
    request(sa, join, {});
    request(sb, join, {});
    if (expect_replies) {
      EXPECT_EQ(reply(sa).first.join, 2);
      EXPECT_EQ(reply(sb).first.join, 2);
    }
    return std::make_pair(ca, cb);
  };
  zmq::socket_t a0 = a.dealer(ctx), b0 = b.dealer(ctx), a1 = a.dealer(ctx), b1 = b.dealer(ctx);
  join_both(a0, b0, 0, true);
  join_both(a1, b1, 1, true);
  push(b0, 0, 0);
  push(b1, 1, 0);
  const auto b_round0_w0 = reply(b0), b_round0_w1 = reply(b1);  // B's round 0: both
  EXPECT_EQ(b_round0_w0.first.join, 0);
  push(a0, 0, 0);  // held on A: its round 0 waits for worker 1. Worker 0 dies here.
  // Worker 1 stays alive on B (heartbeats) until B has expired worker 0 (silent past 2 s; 5 s of heartbeats).
  MsgHeader hb;
  hb.type = static_cast<int>(MsgType::kHeartbeat);
  hb.worker = 1;
  for (int i = 0; i < 50; ++i) {
    request(b1, hb, {});
    request(a1, hb, {});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  zmq::socket_t ra0 = a.dealer(ctx), rb0 = b.dealer(ctx);  // worker 0 restarted: new sockets
  const auto [ca, cb] = join_both(ra0, rb0, 0, false);
  EXPECT_EQ(ca, 1) << "A holds worker 0's push of round 0: it counts it from round 1";
  EXPECT_EQ(cb, 2) << "B expired worker 0 inside its round 1";
  EXPECT_TRUE(nothing_within(ra0, 300) && nothing_within(rb0, 300)) << "a join reply before its round";
  // A's round 0 completes with worker 1; worker 0's join takes effect: out of round 1, counted from 2.
  push(a1, 1, 0);
  const auto a_round0 = reply(a1);
  EXPECT_EQ(a_round0.first.join, 0);
  EXPECT_EQ(a_round0.second, b_round0_w1.second) << "A's round 0 applied other gradients than B's";
  EXPECT_TRUE(nothing_within(a0, 200)) << "the dead process's held push was answered";
  // Round 1 must not wait for worker 0 on either server; both release it with worker 0's join reply.
  push(a1, 1, 1);
  push(b1, 1, 1);
  const auto a_round1 = reply(a1), b_round1 = reply(b1);
  EXPECT_EQ(a_round1.second, b_round1.second) << "the servers applied different gradients in round 1";
  const auto ja = reply(ra0), jb = reply(rb0);
  EXPECT_EQ(ja.first.join, 2);
  EXPECT_EQ(jb.first.join, 2);
  EXPECT_EQ(ja.second, a_round1.second) << "the joiner's reply is not the round it is counted from";
  // Round 2 with both.
  push(ra0, 0, 2);
  push(rb0, 0, 2);
  push(a1, 1, 2);
  push(b1, 1, 2);
  const auto a_round2 = reply(a1), b_round2 = reply(b1);
  EXPECT_EQ(a_round2.first.join, 0);
  EXPECT_EQ(a_round2.second, b_round2.second) << "the servers applied different gradients in round 2";
  EXPECT_EQ(reply(ra0).second, a_round2.second);
  EXPECT_EQ(reply(rb0).second, b_round2.second);
}

// Under ASP a worker back in the job is never told a clock behind its own pushes (they would be
// answered as duplicates: its rounds recomputed for nothing), though the slowest member is behind.
TEST(ElasticShard, AnAspWorkerBackIsNeverBehindItsOwnPushes) {
  ParameterShard s(config("asp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(elastic_init(2, 2), init.data(), nullptr, 0);
  s.join(0, s.join_clock(0), 4, 0.0);
  s.join(1, s.join_clock(1), 4, 0.0);
  for (int64_t c = 0; c < 3; ++c) s.push(elastic_push(0, c, c, 2), g.data());
  s.push(elastic_push(1, 0, 3, 2), g.data());
  s.finish(0);
  EXPECT_EQ(s.join_clock(0), 3);  // its own next clock, not the slowest member's (1)
  EXPECT_EQ(s.join_clock(5), 1);  // a new worker: the slowest member's next clock
}

TEST(ElasticShard, DataGrantsCoverEverySampleOnceAcrossJoinsResendsAndLeaves) {
  ParameterShard s(config("asp"));
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  MsgHeader h = elastic_init(2, 2);
  s.init(h, init.data(), nullptr, 0);
  std::vector<int64_t> granted;
  auto take = [&](int w) { granted.push_back(s.grant(w)); };
  s.join(0, s.join_clock(0), 4, 0.0), take(0);  // the elastic client's start: ask, then join
  s.join(1, s.join_clock(1), 4, 0.0), take(1);
  s.join(0, 0, 4, 0.0);  // a resent join of worker 0: the same grant
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
  s.skip_grant(1, 4), take(1);  // worker 1 skipped that step (nothing pushed): fresh samples for the next
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
  s.join(0, 0, 4, 0.0);
  s.join(1, 0, 4, 0.0);
  s.push(elastic_push(0, 0, 0, 2), g.data());
  EXPECT_FALSE(s.join(4, s.join_clock(4), 4, 0.0));
  s.save(d.str("shard.safetensors"));
  // Grants made after the checkpoint (the crash loses them) must not be made again after a restore.
  std::set<int64_t> before;
  for (int w : {0, 1, 4}) before.insert(s.grant(w));
  for (int64_t k = 1; k < 4; ++k) s.push(elastic_push(0, k, 0, 2), g.data()), before.insert(s.grant(0));
  ParameterShard r(config("bsp"));
  ASSERT_TRUE(r.load(d.str("shard.safetensors"), 0.0));
  EXPECT_TRUE(r.elastic());
  EXPECT_GE(r.data_cursor(), s.data_cursor()) << "the cursor resumes past every grant made before the crash";
  for (int w : {0, 1, 4}) EXPECT_EQ(r.grant(w), -1) << w;  // unknown after a restore: fresh at the next request
  EXPECT_EQ(r.membership_epoch(), s.membership_epoch());
  EXPECT_FALSE(r.member(4));
  EXPECT_EQ(r.push(elastic_push(1, 0, 0, 2), g.data()), (std::vector<int>{0, 1, 4}));  // the held joiner too
  EXPECT_TRUE(r.member(4));
  r.push(elastic_push(0, 0, 0, 2), g.data());  // a resent push the checkpoint holds: a duplicate, a fresh grant
  for (int w : {0, 1}) EXPECT_EQ(before.count(r.grant(w)), 0u) << "sample " << r.grant(w) << " granted twice";
  // A grant past the reserved mark asks for a checkpoint before its reply.
  ParameterShard t(config("asp"));
  t.init(elastic_init(1, 2), init.data(), nullptr, 0);
  t.join(0, 0, 4, 0.0);
  EXPECT_TRUE(t.take_durable_due());
  EXPECT_FALSE(t.take_durable_due());
  int64_t grants = 0;  // pushes until the next forced checkpoint: the reserve's steps, and one past it
  while (!t.take_durable_due() && grants < 10 * ParameterShard::kGrantReserve) t.push(elastic_push(0, grants++, 0, 2), g.data());
  EXPECT_EQ(grants, ParameterShard::kGrantReserve + 1);
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
  // A refused join changes nothing (no slot added).
  ParameterShard e(config("asp"));
  e.init(elastic_init(2, 2), init.data(), nullptr, 0);
  EXPECT_THROW(e.join(5, 0, 0, 0.0), Error);  // no sample count
  EXPECT_EQ(e.stats_json(0).find("\"workers\":6"), std::string::npos);
}

// Real servers and workers: two nodes start a BSP job on two servers whose ranges travel in
// several partitions (each part decides alone); a third node joins while it runs (at the job's
// clock, with the servers' weights); then node 1 gets SIGTERM, stops at a step boundary, writes a
// checkpoint and leaves, and the others go on at once (the servers' worker timeout, 60 s, is never
// what lets them); node 1 is started again with --resume and joins at the job's clock, not at its
// checkpoint's step. Every step's data was granted by the servers: no sample is used twice and
// none is skipped; the servers applied exactly one update per round (a node counted in the wrong
// round would add rounds at the end).
TEST(PsElastic, ANodeJoinsARunningBspJobAndAPreemptedOneLeaves) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_bsp_shards(
      d, {"--ps.worker_timeout_s=60", "--server.checkpoint_dir=" + d.str("server{}"), "--server.checkpoint_every=1"},
      servers);
  constexpr int kSteps = 150;
  auto node = [&](int rank, int nnodes, bool resume = false) {
    std::vector<std::string> x = {"--checkpoint.every=0", "--train.batch_size=2", "--dist.ps_partition_mb=0.01"};
    if (resume) x.push_back("--resume");
    return elastic_node(d, corpus, eps, rank, nnodes, kSteps, x);
  };
  auto node_with_token = [&](int rank, int nnodes, const std::string& token) {
    return elastic_node(d, corpus, eps, rank, nnodes, kSteps,
                        {"--checkpoint.every=0", "--train.batch_size=2", "--dist.ps_partition_mb=0.01"}, token);
  };
  auto w0 = node(0, 2), w1 = node(1, 2);
  ASSERT_TRUE(test::wait_for_step(d.str("w0"), 5, 120)) << test::slurp(d.str("w0.log"));
  auto w2 = node(2, 3);
  // The joiner's first steps are past the job's clock: wait for three of them, whatever their numbers.
  auto logged_steps = [&](const std::string& out) { return step_records(out).size(); };
  for (int i = 0; i < 6000 && logged_steps(d.str("w2")) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(logged_steps(d.str("w2")), 3u) << test::slurp(d.str("w2.log")) << test::slurp(d.str("server0.log"));
  {  // A node of another job (its own token) that tries to join is refused by name within seconds, not
     // after dist.timeout_s (60 s) of silence, and disturbs nothing: the job below ends with every
     // sample taken once and one update per round.
    const auto t0 = std::chrono::steady_clock::now();
    auto stranger = node_with_token(3, 4, "another-job");
    EXPECT_NE(stranger->wait(40), 0) << test::slurp(d.str("w3.log"));
    const double refused_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(refused_s, 30) << "refused only after the timeout";
    const std::string log3 = test::slurp(d.str("w3.log"));
    EXPECT_NE(log3.find("not a server of this job"), std::string::npos) << log3;
    EXPECT_NE(log3.find("SYNCOPATE_TOKEN"), std::string::npos) << log3;
  }
  const auto t_term = std::chrono::steady_clock::now();
  ::kill(w1->pid(), SIGTERM);
  EXPECT_EQ(w1->wait(30), 0) << test::slurp(d.str("w1.log"));
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_term).count();
  EXPECT_LT(stop_s, 10) << "a preempted node stops at its next step boundary";
  const std::string log1 = test::slurp(d.str("w1.log"));
  EXPECT_NE(log1.find("SIGTERM"), std::string::npos) << log1;
  std::vector<nlohmann::json> before_leave;  // node 1's steps before it left (its metrics file is appended to on resume)
  for (const auto& m : test::read_jsonl(d.str("w1/metrics.jsonl")))
    if (m.contains("loss")) before_leave.push_back(m);
  ASSERT_FALSE(before_leave.empty());
  const int64_t left_at = before_leave.back().at("step").get<int64_t>();
  EXPECT_TRUE(std::filesystem::exists(d.str(fmt::format("w1/checkpoints/step_{:06d}", left_at)))) << "preempted: checkpointed";
  ASSERT_TRUE(test::wait_for_step(d.str("w0"), left_at + 10, 120)) << test::slurp(d.str("w0.log"));
  auto w1b = node(1, 2, /*resume=*/true);  // back, with its checkpoint: it joins at the job's clock
  EXPECT_EQ(w0->wait(120), 0) << test::slurp(d.str("w0.log"));
  EXPECT_EQ(w2->wait(120), 0) << test::slurp(d.str("w2.log"));
  EXPECT_EQ(w1b->wait(120), 0) << test::slurp(d.str("w1.log"));
  const std::string log1b = test::slurp(d.str("w1.log")), log2 = test::slurp(d.str("w2.log"));
  EXPECT_NE(log2.find("joined the running job at step"), std::string::npos) << log2;
  EXPECT_NE(log1b.find(fmt::format("its checkpoint was at step {}", left_at)), std::string::npos) << log1b;

  // Per node: its steps (metrics) and the data each took.
  std::map<int, std::vector<nlohmann::json>> steps;
  for (int r = 0; r < 3; ++r)
    for (const auto& m : test::read_jsonl(d.str(fmt::format("w{}/metrics.jsonl", r))))
      if (m.contains("loss")) steps[r].push_back(m);
  ASSERT_FALSE(steps[2].empty());
  const int64_t joined = steps[2].front().at("step").get<int64_t>() - 1;
  EXPECT_GT(joined, 5) << "the joiner starts at the job's clock, not at 0";
  for (int r = 0; r < 3; ++r) EXPECT_EQ(steps[r].back().at("step"), kSteps) << r;
  // Node 1 came back past the steps it missed: its metrics jump from where it left to where it joined.
  int64_t rejoined = -1;
  for (size_t i = 1; i < steps[1].size(); ++i)
    if (steps[1][i].at("step").get<int64_t>() > steps[1][i - 1].at("step").get<int64_t>() + 1)
      rejoined = steps[1][i].at("step").get<int64_t>() - 1;
  EXPECT_GT(rejoined, left_at + 5) << "node 1 rejoins at the job's clock, not at its checkpoint's step";
  // After node 1 left, no node waited for it: no step of the others took as long as a timeout.
  for (int r : {0, 2})
    for (const auto& m : steps[r]) EXPECT_LT(m.at("step_s").get<double>(), 10.0) << "node " << r << " step " << m.at("step");
  // Each step took 2 samples the servers granted: none twice, none skipped (node 1 used again, when
  // it came back, the grant it had not used when it left); each node's last grant is for a step
  // after its last, past every sample used.
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
  EXPECT_EQ(gaps, 0) << "samples skipped";
  // The servers saw the join and the leave, applied one update per round on every partition, and
  // ended with the job (exit_when_done).
  for (auto& s : servers) EXPECT_EQ(s->wait(30), 0);
  const std::string s0 = test::slurp(d.str("server0.log"));
  EXPECT_NE(s0.find("worker 2 joins"), std::string::npos) << s0;
  EXPECT_NE(s0.find("worker 1 finished"), std::string::npos) << s0;
  EXPECT_NE(s0.find("failed the handshake"), std::string::npos) << "the stranger, logged by the server: " << s0;
  // The exit's count of connections: the nodes' completed, the stranger's failed.
  const auto conn = s0.rfind("connections: ");
  ASSERT_NE(conn, std::string::npos) << s0;
  int completed = 0, failed = 0;
  ASSERT_EQ(std::sscanf(s0.c_str() + conn, "connections: %d handshake(s) completed, %d failed", &completed, &failed), 2) << s0;
  EXPECT_GE(completed, 3);
  EXPECT_GE(failed, 1);
  const auto stats_at = s0.rfind("stats {");
  ASSERT_NE(stats_at, std::string::npos) << s0;
  const auto stats = nlohmann::json::parse(s0.substr(stats_at + 6, s0.find('\n', stats_at) - stats_at - 6));
  EXPECT_GT(stats.at("partitions").get<int>(), 1);
  EXPECT_EQ(stats.at("version"), kSteps) << "one update per round on every partition";
  EXPECT_GE(stats.at("membership_epoch").get<int>(), 3);  // node 2 joined, node 1 left and came back
}

// A node of two local replicas (threads) gets SIGTERM: both replicas stop after the same step (they
// agree through the node's per-step collective), the node checkpoints, leaves and exits 0 well
// within the grace period (one replica going on alone would block in the node's next collective
// until the watchdog ended the process with 143).
TEST(PsElastic, APreemptedNodeStopsEveryLocalReplicaAtTheSameStep) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::string bin = test::bin_dir();
  const test::ServerPort port = test::any_server_port(d);
  std::vector<std::string> sa = {bin + "/syncopate-server", "--ps.consistency=asp"};
  sa.insert(sa.end(), port.args.begin(), port.args.end());
  test::Process server(sa, {"SYNCOPATE_TOKEN=t"}, d.str("server.log"));
  const std::string ep = test::wait_for_line(port.endpoint_file, 60, &server);
  std::vector<std::string> a = {bin + "/syncopate-worker", "--out", d.str("w"), "--model.n_embd=32", "--model.n_head=2",
                                "--model.block_size=32", "--train.threads=1", "--eval.every=0", "--eval.batches=1",
                                "--eval.sample_tokens=0", "--checkpoint.every=0", "--data.corpus=" + corpus,
                                "--data.cache_dir=" + d.str("cache"), "--train.steps=2000", "--train.batch_size=2",
                                "--emulate.step_time_s=0.05", "--dist.mode=ps", "--dist.elastic=true", "--dist.servers=" + ep,
                                "--dist.local_replicas=2", "--train.preempt_grace_s=60"};
  test::Process w(a, {"SYNCOPATE_TOKEN=t", "NNODES=1", "NODE_RANK=0"}, d.str("w.log"));
  ASSERT_TRUE(test::wait_for_step(d.str("w"), 5, 120)) << test::slurp(d.str("w.log"));
  const auto t_term = std::chrono::steady_clock::now();
  ::kill(w.pid(), SIGTERM);
  EXPECT_EQ(w.wait(60), 0) << test::slurp(d.str("w.log"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_term).count(), 10.0);
  const std::string log = test::slurp(d.str("w.log"));
  EXPECT_NE(log.find("SIGTERM: node 0 stopped after step"), std::string::npos) << log;
  EXPECT_TRUE(std::filesystem::exists(d.str("w/checkpoints/latest"))) << log;
}


// Local SGD / DiLoCo on elastic parameter servers (dist.sync_every = 6, BSP, Nesterov outer step):
// node 0 has two local replicas; node 2 joins the running job; node 2 is preempted (SIGTERM) in the
// middle of a round and comes back later with --resume; node 1 is killed (SIGKILL) in the middle of
// a round and restarted at once, long before the servers would expire it: its join counts it out of
// the round it was in, so the others do not wait for it to redo that round. Every node joins at a
// round boundary the shards chose; the servers applied exactly one outer step per round; every
// sample of an applied round was granted once and none skipped (a node back after losing its
// partial round uses that round's grant); the partial rounds left no trace.
TEST(PsElastic, LocalSgdRoundsGoOnAsNodesJoinLeaveAndDie) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  constexpr int kSteps = 150, kEvery = 6, kBatch = 2;
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_bsp_shards(d, {"--ps.worker_timeout_s=20"}, servers);
  auto node = [&](int rank, int nnodes, bool resume = false) {
    std::vector<std::string> x = {"--checkpoint.every=3", "--train.batch_size=" + std::to_string(kBatch),
                                  "--dist.sync_every=" + std::to_string(kEvery), "--dist.outer=nesterov",
                                  "--dist.outer_lr=0.7", "--dist.outer_momentum=0.9",
                                  fmt::format("--dist.local_replicas={}", rank == 0 ? 2 : 1)};
    if (resume) x.push_back("--resume");
    return elastic_node(d, corpus, eps, rank, nnodes, kSteps, x);
  };
  auto steps_of = [&](int rank) { return step_records(d.str(fmt::format("w{}", rank))); };
  // Waits until the node logged a step in the middle of a round, at least `at_least`; returns it.
  auto wait_mid_round = [&](int rank, int64_t at_least) {
    for (int i = 0; i < 6000; ++i) {
      const auto s = steps_of(rank);
      if (!s.empty() && s.rbegin()->first >= at_least && s.rbegin()->first % kEvery == 2) return s.rbegin()->first;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return int64_t{-1};
  };
  // Waits until the node logged a step at or past `step` (a node may start past step 0: the first
  // nodes of a fresh BSP job join one after the other, the later ones a round later).
  auto wait_past = [&](int rank, int64_t step) {
    for (int i = 0; i < 6000; ++i) {
      const auto s = steps_of(rank);
      if (!s.empty() && s.rbegin()->first >= step) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  auto w0 = node(0, 2), w1 = node(1, 2);
  ASSERT_TRUE(wait_past(0, 2 * kEvery)) << test::slurp(d.str("w0.log"));
  auto w2 = node(2, 3);
  const int64_t term_at = wait_mid_round(2, 0);
  ASSERT_GE(term_at, 0) << test::slurp(d.str("w2.log")) << test::slurp(d.str("server0.log"));
  ::kill(w2->pid(), SIGTERM);
  EXPECT_EQ(w2->wait(30), 0) << test::slurp(d.str("w2.log"));
  const std::string log2 = test::slurp(d.str("w2.log"));
  EXPECT_NE(log2.find("in the middle of a round"), std::string::npos) << log2;
  const int64_t kill_at = wait_mid_round(1, term_at + kEvery);
  ASSERT_GE(kill_at, 0) << test::slurp(d.str("w1.log"));
  ::kill(w1->pid(), SIGKILL);
  w1->wait(30);
  auto w1b = node(1, 2, /*resume=*/true);  // at once: the servers still count node 1 (20 s worker timeout)
  ASSERT_TRUE(wait_past(0, kill_at + 2 * kEvery)) << test::slurp(d.str("w0.log"));
  auto w2b = node(2, 3, /*resume=*/true);
  EXPECT_EQ(w0->wait(120), 0) << test::slurp(d.str("w0.log"));
  EXPECT_EQ(w1b->wait(120), 0) << test::slurp(d.str("w1.log"));
  EXPECT_EQ(w2b->wait(120), 0) << test::slurp(d.str("w2.log"));
  for (auto& s : servers) EXPECT_EQ(s->wait(30), 0);

  // Each node's last step is the job's; every node joined at a round boundary (the joiner's first
  // step, and each returning node's first step past a gap in its records).
  std::map<int, std::map<int64_t, nlohmann::json>> steps;
  for (int r = 0; r < 3; ++r) {
    steps[r] = steps_of(r);
    ASSERT_FALSE(steps[r].empty()) << r;
    EXPECT_EQ(steps[r].rbegin()->first, kSteps) << r;
    int64_t prev = -1;
    for (const auto& [step, m] : steps[r]) {
      if (step != prev + 1) EXPECT_EQ((step - 1) % kEvery, 0) << "node " << r << " started at step " << step - 1;
      prev = step;
    }
  }
  EXPECT_GT(steps[2].begin()->first - 1, 0) << "the joiner starts at the job's round, not at 0";
  // Node 0 never waited for a timeout: node 1's restart counted it out of its round (or, where node 1
  // asked before anyone pushed the round, node 1 redid it at once).
  for (const auto& [step, m] : steps[0]) EXPECT_LT(m.at("step_s").get<double>(), 10.0) << "node 0 step " << step;
  // (Node 1, back while the servers count it, may be told its own round: where nobody had pushed
  // that round yet, it redoes it, and where its checkpoint was at that boundary it says nothing.)
  const std::string log2b = test::slurp(d.str("w2.log"));
  EXPECT_NE(log2b.find("joined the running job at step"), std::string::npos) << log2b;
  // The samples of every applied round (its last step logged: the push precedes the record), each
  // node's inner step k of a round at grant + k x the node's samples per step: none twice, none skipped.
  std::vector<int64_t> used;
  for (auto& [r, by_step] : steps) {
    const int64_t per_step = kBatch * (r == 0 ? 2 : 1);
    for (const auto& [step, m] : by_step) {
      if (!by_step.count((step - 1) / kEvery * kEvery + kEvery)) continue;  // a partial round, never pushed
      const int64_t first = m.at("data_position").get<int64_t>();
      for (int64_t k = 0; k < per_step; ++k) used.push_back(first + k);
    }
  }
  std::map<int64_t, std::vector<std::string>> owner;  // sample -> "node:step" that took it (for the message)
  for (auto& [r, by_step] : steps)
    for (const auto& [step, m] : by_step)
      if (by_step.count((step - 1) / kEvery * kEvery + kEvery))
        owner[m.at("data_position").get<int64_t>()].push_back(fmt::format("{}:{}", r, step));
  std::string twice;
  for (const auto& [sample, who] : owner)
    if (who.size() > 1) twice += fmt::format(" {}@{}", sample, fmt::join(who, "/"));
  std::sort(used.begin(), used.end());
  EXPECT_EQ(std::adjacent_find(used.begin(), used.end()), used.end()) << "a sample granted twice:" << twice;
  ASSERT_FALSE(used.empty());
  EXPECT_EQ(used.front(), 0);
  EXPECT_EQ(used.back() - used.front() + 1, static_cast<int64_t>(used.size())) << "samples skipped";
  // Within a round a node's inner steps take its grant's consecutive samples (node 0: 2 replicas x 2).
  const auto first0 = steps[0].begin();
  EXPECT_EQ(std::next(first0)->second.at("data_position").get<int64_t>() - first0->second.at("data_position").get<int64_t>(),
            2 * kBatch);
  // One outer step per round on every shard (a node counted in the wrong round would add rounds).
  const std::string s0 = test::slurp(d.str("server0.log"));
  EXPECT_NE(s0.find("worker 2 joins"), std::string::npos) << s0;
  EXPECT_NE(s0.find("worker 2 finished"), std::string::npos) << s0;
  const auto stats_at = s0.rfind("stats {");
  ASSERT_NE(stats_at, std::string::npos) << s0;
  const auto stats = nlohmann::json::parse(s0.substr(stats_at + 6, s0.find('\n', stats_at) - stats_at - 6));
  EXPECT_EQ(stats.at("version"), kSteps / kEvery) << "one outer step per round";
  EXPECT_GE(stats.at("membership_epoch").get<int>(), 5);  // node 2 joined and left, node 1 lost, both back
}

}  // namespace
}  // namespace syncopate
