// Parameter-server partitions (dist.ps_partition_mb): the cut of the flat vector into parts, a
// server's partitions (transport-free), and real server processes answering parts out of order.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/comm/sharding.h"
#include "server/parameter_shard.h"
#include "server/ps_client.h"
#include "server/ps_protocol.h"
#include "server/shard_partitions.h"
#include "tests/test_helpers.h"
#include "tests/ps_test_messages.h"

using namespace syncopate;

namespace {
// INIT of [offset, +length) with `partition` values per partition; a push of that range at `clock`
// on version `clock`.
MsgHeader init_of(int64_t offset, int64_t length, int64_t partition, int workers = 1) {
  return test::init_header(workers, length, offset, partition);
}
MsgHeader push_of(int worker, int64_t offset, int64_t length, int64_t clock) {
  return test::push_header(worker, clock, clock, length, offset);
}
// ASP with workers that never time out during a test.
PsConfig asp_config() {
  PsConfig cfg;
  cfg.consistency = "asp";
  cfg.worker_timeout_s = 1000;
  return cfg;
}
}  // namespace

TEST(PsClient, PartBoundsCutEachShardIntoTheFewestNearEqualPieces) {
  std::vector<int> server;
  EXPECT_EQ(PsClient::part_bounds(10, 2, 0, &server), (std::vector<int64_t>{0, 5, 10}));  // unpartitioned: the shards
  EXPECT_EQ(server, (std::vector<int>{0, 1}));
  EXPECT_EQ(PsClient::part_bounds(10, 2, 2, &server), (std::vector<int64_t>{0, 1, 3, 5, 6, 8, 10}));
  EXPECT_EQ(server, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(PsClient::part_bounds(10, 2, 5), (std::vector<int64_t>{0, 5, 10}));  // a shard that fits is one part
  EXPECT_EQ(PsClient::part_bounds(2, 3, 4, &server), (std::vector<int64_t>{0, 0, 1, 2}));  // an empty shard: one empty part
  EXPECT_EQ(server, (std::vector<int>{0, 1, 2}));
  for (int64_t n : {1, 7, 1000, 4097}) {  // every part within the limit, contiguous, inside its server's shard
    for (int64_t part : {1, 3, 64}) {
      const auto b = PsClient::part_bounds(n, 3, part, &server);
      const auto shard = Sharding::bounds(n, 3);
      ASSERT_EQ(b.front(), 0);
      ASSERT_EQ(b.back(), n);
      for (size_t p = 0; p + 1 < b.size(); ++p) {
        EXPECT_LE(b[p], b[p + 1]);
        EXPECT_LE(b[p + 1] - b[p], part);
        EXPECT_GE(b[p], shard[server[p]]);
        EXPECT_LE(b[p + 1], shard[server[p] + 1]);
      }
    }
  }
  EXPECT_NE(test::error_of([] { PsClient::part_bounds(kMaxPartitionsPerServer + 1, 1, 1); }).find("dist.ps_partition_mb"),
            std::string::npos);
}

TEST(ShardPartitions, HoldsDisjointPartitionsAndRefusesOverlapsOrMixedSettings) {
  test::TempDir d;
  PsConfig cfg;
  cfg.consistency = "asp";
  ShardPartitions parts(cfg, 0, d.str("ck"), 1);
  std::vector<float> v(8);
  for (int i = 0; i < 8; ++i) v[i] = 0.5f * static_cast<float>(i);
  parts.init(init_of(0, 4, 4), v.data(), nullptr, 0, 0);
  parts.init(init_of(4, 4, 4), v.data() + 4, nullptr, 0, 0);
  EXPECT_EQ(parts.size(), 2u);
  parts.init(init_of(4, 4, 4), v.data() + 4, nullptr, 0, 0);  // a second worker's INIT of a partition held: agrees
  EXPECT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts.at(push_of(0, 4, 4, 0)).offset(), 4);
  EXPECT_NE(test::error_of([&] { parts.at(push_of(0, 0, 8, 0)); }).find("is no partition of this server"), std::string::npos);
  EXPECT_NE(test::error_of([&] { parts.init(init_of(2, 4, 4), v.data(), nullptr, 0, 0); }).find("dist.ps_partition_mb"),
            std::string::npos);  // overlaps both
  EXPECT_NE(test::error_of([&] { parts.init(init_of(8, 4, 0), v.data(), nullptr, 0, 0); }).find("dist.ps_partition_mb"),
            std::string::npos);  // a whole range beside partitions: mixed settings
  EXPECT_NE(test::error_of([&] { parts.init(init_of(8, 5, 4), v.data(), nullptr, 0, 0); }).find("partition size 4"),
            std::string::npos);  // longer than a partition
  EXPECT_EQ(parts.size(), 2u);  // nothing refused was kept

  const std::vector<float> g(4, 1.0f);
  parts.at(push_of(0, 0, 4, 0)).push(push_of(0, 0, 4, 0), g.data());
  parts.at(push_of(0, 4, 4, 0)).push(push_of(0, 4, 4, 0), g.data());
  parts.at(push_of(0, 0, 4, 1)).push(push_of(0, 0, 4, 1), g.data());  // partition 0 one update ahead
  auto s = nlohmann::json::parse(parts.stats_json(0, -1, -1));
  EXPECT_EQ(s["partitions"], 2);
  EXPECT_EQ(s["length"], 8);
  EXPECT_EQ(s["version"], 1);  // the lowest partition's
  EXPECT_EQ(s["updates"], 3);  // summed, as the staleness histogram
  EXPECT_EQ(s["staleness_histogram"]["0"], 3) << s.dump();

  parts.checkpoint_all();
  ShardPartitions back(cfg, 0, d.str("ck"), 1);
  EXPECT_EQ(back.load(0), 2);
  EXPECT_TRUE(torch::equal(back.at(push_of(0, 0, 4, 0)).params(), parts.at(push_of(0, 0, 4, 0)).params()));
  EXPECT_TRUE(torch::equal(back.at(push_of(0, 4, 4, 0)).params(), parts.at(push_of(0, 4, 4, 0)).params()));
  EXPECT_EQ(back.at(push_of(0, 0, 4, 0)).version(), 2);
  EXPECT_TRUE(std::filesystem::exists(d.str("ck/shard_0.at4.safetensors")));

  // A directory that also holds an unpartitioned checkpoint of the same shard is refused by name.
  ShardPartitions whole(cfg, 0, d.str("ck"), 1);
  whole.init(init_of(0, 8, 0), v.data(), nullptr, 0, 0);
  whole.checkpoint_all();
  ShardPartitions mixed(cfg, 0, d.str("ck"), 1);
  EXPECT_NE(test::error_of([&] { mixed.load(0); }).find("mixes partition sizes"), std::string::npos);
}

// Two BSP workers on two real server processes, 4 parts per server. Each worker pushes its parts in
// a random order and waits for them in another, so replies arrive in an order unlike the waits
// (kept for their own wait by part and clock); the result must equal, bit for bit, unpartitioned
// shards fed the same gradients. A worker with another partition size is refused by name.
TEST(PsClient, PartsReassembleExactlyUnderReordering) {
  test::TempDir d;
  std::vector<std::unique_ptr<test::Process>> servers;
  std::string eps;
  for (int k = 0; k < 2; ++k) {
    const test::ServerPort port = test::any_server_port(d);
    std::vector<std::string> args = {test::bin_dir() + "/syncopate-server", "--server.shard=" + std::to_string(k),
                                     "--ps.consistency=bsp", "--server.encrypt=off"};
    args.insert(args.end(), port.args.begin(), port.args.end());
    servers.push_back(std::make_unique<test::Process>(args, std::vector<std::string>{"SYNCOPATE_TOKEN=t"},
                                                      d.str(fmt::format("server{}.log", k))));
    eps += (k ? "," : "") + test::wait_for_line(port.endpoint_file, 60, servers.back().get());
  }
  constexpr int64_t kN = 20, kSteps = 4;
  PsClientOptions o{60};
  o.first_resend_s = 15;  // a reply routed nowhere would show as a resend; a loaded machine must not
  o.partition_elems = 3;  // shards of 10 values: parts of 2, 3, 2, 3
  torch::manual_seed(1);
  const at::Tensor start = torch::randn({kN});
  auto grad = [](int worker, int64_t step) {
    return torch::randn({kN}, torch::TensorOptions().dtype(torch::kFloat)).mul_(0.1 * (worker + 1) + 0.01 * step);
  };
  std::vector<std::vector<at::Tensor>> grads(2);
  for (int w = 0; w < 2; ++w)
    for (int64_t s = 0; s < kSteps; ++s) grads[w].push_back(grad(w, s));
  std::vector<at::Tensor> result(2);
  std::vector<std::string> failure(2);
  auto worker = [&](int w) {
    try {
      PsClient c(PsClient::parse_endpoints(eps), "t", w, 2, o);
      at::Tensor params = start.clone();
      c.init(params, {}, AdamWConfig{});
      ASSERT_EQ(c.parts(), 8);
      std::mt19937 rng(100 + w);
      std::vector<int> order(8);
      for (int p = 0; p < 8; ++p) order[p] = p;
      const auto& b = c.bounds();
      for (int64_t s = 0; s < kSteps; ++s) {
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<PsTicket> tickets(8);
        for (int p : order) tickets[p] = c.push(p, grads[w][s].slice(0, b[p], b[p + 1]), s, 0.05);
        std::shuffle(order.begin(), order.end(), rng);
        for (int p : order) {
          at::Tensor into = params.slice(0, b[p], b[p + 1]);
          c.wait(tickets[p], into);
        }
      }
      result[w] = params;
      EXPECT_EQ(c.counters().resends, 0);  // every reply was matched to its push (none waited out into a resend)
    } catch (const Error& e) {
      failure[w] = e.what();
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(failure[0] + failure[1], "");
  ASSERT_TRUE(result[0].defined() && result[1].defined());

  // The reference: each server's whole range as one BSP ParameterShard, the same gradients.
  PsConfig cfg;
  cfg.consistency = "bsp";
  at::Tensor want = start.clone();
  const auto shard = Sharding::bounds(kN, 2);
  for (int k = 0; k < 2; ++k) {
    ParameterShard ref(cfg);
    MsgHeader h = init_of(shard[k], shard[k + 1] - shard[k], 0, 2);
    const AdamWConfig oc;
    h.beta1 = oc.beta1, h.beta2 = oc.beta2, h.eps = oc.eps, h.weight_decay = oc.weight_decay;
    ref.init(h, start.data_ptr<float>() + shard[k], nullptr, 0);
    for (int64_t s = 0; s < kSteps; ++s)
      for (int w = 0; w < 2; ++w) {
        MsgHeader p = push_of(w, h.offset, h.length, s);
        p.lr = 0.05;
        ref.push(p, grads[w][s].data_ptr<float>() + shard[k]);
      }
    want.slice(0, shard[k], shard[k + 1]).copy_(ref.params());
  }
  EXPECT_TRUE(torch::equal(result[0], want)) << (result[0] - want).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(result[1], want)) << (result[1] - want).abs().max().item<double>();

  PsClient probe(PsClient::parse_endpoints(eps), "t", 0, 2, PsClientOptions{20});
  for (int k = 0; k < 2; ++k) {
    const auto s = nlohmann::json::parse(probe.stats(k));
    EXPECT_EQ(s["partitions"], 4) << s.dump();
    EXPECT_EQ(s["version"], kSteps) << s.dump();
    EXPECT_EQ(s["duplicates"], 0) << s.dump();
  }
  at::Tensor p = start.clone();
  PsClientOptions whole{5};  // partition 0: the job's layout and partitions differ
  PsClient other(PsClient::parse_endpoints(eps), "t", 1, 2, whole);
  EXPECT_NE(test::error_of([&] { other.init(p, {}, AdamWConfig{}); }).find("ps_partition_mb"), std::string::npos);
  probe.shutdown_servers();
  for (auto& s : servers) EXPECT_EQ(s->wait(20), 0);
}

namespace {
// Polls pump() until the partitions' snapshot `n` is committed; false after `limit_s`.
bool wait_committed(ShardPartitions& parts, int64_t n, double limit_s = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (parts.committed() < n) {
    if (std::chrono::steady_clock::now() > until) return false;
    parts.pump();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// server.checkpoint_background: a checkpoint is a snapshot taken when pump() finds nothing in
// flight, written by a thread of its own, and in place only at the end of its modelled write
// (server.checkpoint_s). What it holds is the state when it was taken, whatever the shard applied
// while it was written; a checkpoint due meanwhile is the next snapshot.
TEST(ShardPartitions, BackgroundCheckpointsWriteTheirSnapshotAndCommitAtTheEndOfTheHold) {
  test::TempDir d;
  PsConfig cfg;
  cfg.consistency = "asp";
  const double hold = 0.5;
  ShardPartitions parts(cfg, 0, d.str("ck"), /*every=*/2, /*background=*/true, hold);
  ASSERT_TRUE(parts.background());
  std::vector<float> v(4, 1.0f), g(4, 1.0f);
  ParameterShard& shard = parts.init(init_of(0, 4, 0), v.data(), nullptr, 0, 0);
  const std::string file = d.str("ck/shard_0.safetensors");
  EXPECT_EQ(parts.covering_snapshot(), 1);  // (a created partition is durable before its INIT's reply)
  const auto t0 = std::chrono::steady_clock::now();
  parts.pump();  // too early: requests that come together share a write (group commit)
  EXPECT_EQ(parts.covering_snapshot(), 1);
  std::this_thread::sleep_for(std::chrono::duration<double>(ShardPartitions::kGroupCommitS * 1.2));
  parts.pump();  // snapshot 1: version 0
  EXPECT_EQ(parts.committed(), 0);
  for (int64_t c = 0; c < 2; ++c) {  // the shard goes on while the write is in flight
    parts.at(push_of(0, 0, 4, c)).push(push_of(0, 0, 4, c), g.data());
    parts.checkpoint(shard);  // due after 2 updates: wanted, taken once the write in flight is done
  }
  EXPECT_FALSE(std::filesystem::exists(file)) << "a background write is in place before its modelled time";
  EXPECT_EQ(parts.covering_snapshot(), 2) << "the state now is in the snapshot after the one in flight";
  ASSERT_TRUE(wait_committed(parts, 1));
  EXPECT_GE(seconds_since(t0), hold * 0.95);
  {
    ParameterShard saved{cfg};
    ASSERT_TRUE(saved.load(file, 0.0));
    EXPECT_EQ(saved.version(), 0) << "the snapshot is a copy taken before the pushes, not the live state";
    EXPECT_TRUE(torch::equal(saved.params(), torch::ones({4})));
  }
  ASSERT_TRUE(wait_committed(parts, 2));  // the wanted one, taken by pump() after the first committed
  {
    ParameterShard saved{cfg};
    ASSERT_TRUE(saved.load(file, 0.0));
    EXPECT_EQ(saved.version(), 2);
    EXPECT_TRUE(torch::equal(saved.params(), shard.params()));
    const auto a = nlohmann::json::parse(saved.stats_json(0)), b = nlohmann::json::parse(shard.stats_json(0));
    EXPECT_EQ(a["clocks"], b["clocks"]);
  }
  parts.at(push_of(0, 0, 4, 2)).push(push_of(0, 0, 4, 2), g.data());
  EXPECT_EQ(parts.covering_snapshot(), 3);
  parts.checkpoint_all();  // on this thread, now: every snapshot wanted so far counts as committed
  EXPECT_EQ(parts.committed(), 3);
  ParameterShard saved{cfg};
  ASSERT_TRUE(saved.load(file, 0.0));
  EXPECT_EQ(saved.version(), 3);
  const auto stats = nlohmann::json::parse(parts.stats_json(0, 0, 0));
  EXPECT_EQ(stats["checkpoint_snapshots"], 2);    // taken by pump() and written by the thread
  EXPECT_EQ(stats["checkpoint_sync_writes"], 1);  // checkpoint_all's, on the request path
}

// Background checkpoints make a join or a FINISH durable by a record of the membership journal, not
// by a write of the whole state: a shard restored from a snapshot taken before them (the pushes after
// it lost, as the mode says) gets them re-delivered, so the joiner is a member at its clock and the
// finished worker is out. A record the file already holds is not re-delivered (by snapshot number); a
// commit drops the records it covers; a damaged journal is refused by name; one beside no checkpoint
// (another run's) is removed.
TEST(ShardPartitions, TheMembershipJournalRedeliversTheJoinsAndFinishesAWriteDidNotHold) {
  test::TempDir d;
  const PsConfig cfg = asp_config();
  std::vector<float> v(2, 0.0f), g(2, 1.0f);
  MsgHeader h = init_of(0, 2, 0, 2);
  h.elastic = true;
  h.samples = 4;
  auto push = [&](ParameterShard& s, int w, int64_t c) {
    MsgHeader p = push_of(w, 0, 2, c);
    p.samples = 4;
    s.push(p, g.data());
  };
  int64_t join_clock = -1;
  {
    ShardPartitions parts(cfg, 0, d.str("ck"), /*every=*/1 << 30, /*background=*/true, /*hold_s=*/0);
    ParameterShard& shard = parts.init(h, v.data(), nullptr, 0, 0);
    for (int w : {0, 1}) {
      shard.join(w, 0, 4, 0.0);
      parts.record_join(shard, w, 0, 4, -1);
    }
    EXPECT_EQ(parts.journal_size(), 2u);
    EXPECT_TRUE(parts.record_join(shard, 1, 0, 4, -1));  // a resent join, not covered yet: not recorded again
    EXPECT_EQ(parts.journal_size(), 2u);
    for (int64_t c = 0; c < 3; ++c) push(shard, 0, c), push(shard, 1, c);
    ASSERT_TRUE(wait_committed(parts, parts.covering_snapshot()));
    EXPECT_EQ(parts.journal_size(), 0u) << "a commit keeps the records it covers";
    EXPECT_FALSE(std::filesystem::exists(d.str("ck/shard_0.members")));
    // After the snapshot: worker 2 joins, worker 1 finishes, worker 0 pushes once more. No write holds
    // them when the process ends (nothing pumps: a kill before the write).
    join_clock = shard.join_clock(2);
    EXPECT_EQ(join_clock, 3);
    shard.join(2, join_clock, 4, 0.0);
    parts.record_join(shard, 2, join_clock, 4, -1);
    shard.finish(1);
    parts.record_finish(1, false);
    push(shard, 0, 3);
    EXPECT_EQ(parts.journal_size(), 2u);
  }
  ASSERT_TRUE(std::filesystem::exists(d.str("ck/shard_0.members")));
  const std::string journal = test::slurp(d.str("ck/shard_0.members"));
  auto restore_and_check = [&](bool with_journal) {
    ShardPartitions restored(cfg, 0, d.str("ck"), 1 << 30, true, 0);
    ASSERT_EQ(restored.load(0), 1);
    ParameterShard& s = restored.at(push_of(0, 0, 2, 0));
    EXPECT_EQ(s.version(), 6) << "the snapshot's state: the push after it is lost (background mode)";
    EXPECT_EQ(s.member(2), with_journal) << "the join acknowledged after the snapshot";
    EXPECT_EQ(s.member(1), !with_journal) << "the FINISH acknowledged after the snapshot";
    EXPECT_TRUE(s.member(0));
    if (with_journal) EXPECT_EQ(s.clock(2), join_clock - 1) << "the joiner's next push is its join clock";
    const auto stats = nlohmann::json::parse(restored.stats_json(0, 0, 0));
    EXPECT_EQ(stats["finished"][1].get<bool>(), with_journal);
  };
  restore_and_check(true);
  std::filesystem::remove(d.str("ck/shard_0.members"));
  restore_and_check(false);  // (without it, both are gone: the journal is what holds them)
  // A record the file holds (its snapshot number is not above the file's) is not re-delivered: a
  // FINISH of worker 0 for snapshot 1 leaves worker 0 a member of the restored part.
  nlohmann::json covered = nlohmann::json::parse(journal);
  covered["records"] = nlohmann::json::parse(
      R"([{"snapshot":1,"offset":-1,"op":"finish","worker":0,"clock":0,"samples":0,"pushed":-1,"reading":false},
          {"snapshot":99,"offset":-1,"op":"finish","worker":1,"clock":0,"samples":0,"pushed":-1,"reading":false}])");
  write_file_atomic(d.str("ck/shard_0.members"), covered.dump());
  {
    ShardPartitions restored(cfg, 0, d.str("ck"), 1 << 30, true, 0);
    ASSERT_EQ(restored.load(0), 1);
    EXPECT_TRUE(restored.at(push_of(0, 0, 2, 0)).member(0));
    EXPECT_FALSE(restored.at(push_of(0, 0, 2, 0)).member(1)) << "(the record after the file's snapshot)";
  }
  // A journal of another run (checkpoint files brought from elsewhere beside it) is not re-delivered.
  nlohmann::json other = nlohmann::json::parse(journal);
  other["run"] = "another run";
  write_file_atomic(d.str("ck/shard_0.members"), other.dump());
  {
    ShardPartitions restored(cfg, 0, d.str("ck"), 1 << 30, true, 0);
    ASSERT_EQ(restored.load(0), 1);
    EXPECT_FALSE(restored.at(push_of(0, 0, 2, 0)).member(2));
    EXPECT_FALSE(std::filesystem::exists(d.str("ck/shard_0.members")));
  }
  write_file_atomic(d.str("ck/shard_0.members"), journal.substr(0, journal.size() / 2));
  {
    ShardPartitions damaged(cfg, 0, d.str("ck"), 1 << 30, true, 0);
    const std::string e = test::error_of([&] { damaged.load(0); });
    EXPECT_NE(e.find("shard_0.members' is not a membership journal"), std::string::npos) << e;
    EXPECT_NE(e.find("restore it, or delete it"), std::string::npos) << e;
  }
  std::filesystem::remove(d.str("ck/shard_0.safetensors"));
  ShardPartitions fresh(cfg, 0, d.str("ck"), 1 << 30, true, 0);
  EXPECT_EQ(fresh.load(0), 0);
  EXPECT_FALSE(std::filesystem::exists(d.str("ck/shard_0.members"))) << "another run's journal was kept";
}

// The grant reserve (an elastic job's data order) is made durable by a small record, not a whole
// checkpoint: a shard restored from an older checkpoint resumes its cursor past every sample it
// granted, and only because of the record. A damaged record is refused by name.
TEST(ShardPartitions, TheGrantReserveRecordKeepsARestoreFromGrantingASampleTwice) {
  test::TempDir d;
  const PsConfig cfg = asp_config();
  std::vector<float> v(2, 0.0f), g(2, 1.0f);
  int64_t newest_grant = -1;
  {
    ShardPartitions parts(cfg, 0, d.str("ck"), /*every=*/1 << 30);
    MsgHeader h = init_of(0, 2, 0, 1);
    h.elastic = true;
    h.samples = 4;
    ParameterShard& shard = parts.init(h, v.data(), nullptr, 0, 0);
    parts.checkpoint(shard, true);  // the partition's first checkpoint (its INIT's); none after it
    shard.join(0, 0, 4, 0.0);
    for (int64_t c = 0; c < 3 * ParameterShard::kGrantReserve; ++c) {
      parts.make_reserve_durable(shard);  // (as the server does before every reply: writes when the mark moved)
      newest_grant = std::max(newest_grant, shard.grant(0));
      MsgHeader p = push_of(0, 0, 2, c);
      p.samples = 4;
      shard.push(p, g.data());
    }
    parts.make_reserve_durable(shard);
    newest_grant = std::max(newest_grant, shard.grant(0));
  }
  ASSERT_TRUE(std::filesystem::exists(d.str("ck/shard_0.safetensors.reserve")));
  {
    ShardPartitions restored(cfg, 0, d.str("ck"), 1 << 30);
    ASSERT_EQ(restored.load(0), 1);
    MsgHeader any = push_of(0, 0, 2, 0);
    EXPECT_GE(restored.at(any).data_cursor(), newest_grant + 4) << "a restore would grant samples of " << newest_grant << " again";
  }
  std::filesystem::remove(d.str("ck/shard_0.safetensors.reserve"));
  {  // without it, the checkpoint's own mark is behind: the record is what keeps the order
    ShardPartitions restored(cfg, 0, d.str("ck"), 1 << 30);
    ASSERT_EQ(restored.load(0), 1);
    EXPECT_LE(restored.at(push_of(0, 0, 2, 0)).data_cursor(), newest_grant);
  }
  write_file_atomic(d.str("ck/shard_0.safetensors.reserve"), "12x\n");
  ShardPartitions damaged(cfg, 0, d.str("ck"), 1 << 30);
  const std::string e = test::error_of([&] { damaged.load(0); });
  EXPECT_NE(e.find("shard_0.safetensors.reserve' does not hold a data cursor"), std::string::npos) << e;
  // A partition created anew (its checkpoint deleted, the record left) drops the old run's record.
  std::filesystem::remove(d.str("ck/shard_0.safetensors"));
  ShardPartitions fresh(cfg, 0, d.str("ck"), 1 << 30);
  EXPECT_EQ(fresh.load(0), 0);
  MsgHeader h = init_of(0, 2, 0, 1);
  h.elastic = true;
  h.samples = 4;
  fresh.init(h, v.data(), nullptr, 0, 0);
  EXPECT_FALSE(std::filesystem::exists(d.str("ck/shard_0.safetensors.reserve")));
}
