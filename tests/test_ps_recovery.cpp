// Parameter servers across checkpoints, restarts and releases (issue 26): a shard restored from a
// checkpoint taken while a BSP clock was partly collected still holds the held workers' gradients;
// a duplicate of an older clock is answered at once even while the worker's newer push is held;
// FINISH survives a restart; clocks released by FINISH or a timeout are durable before they are
// acknowledged. Shards are driven directly (transport-free) or through a real server on loopback.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/check.h"
#include "common/comm/wire_format.h"
#include "server/parameter_shard.h"
#include "server/ps_client.h"
#include "server/shard_partitions.h"
#include "tests/ps_in_process_server.h"
#include "tests/ps_test_messages.h"
#include "tests/test_helpers.h"
#include "worker/sync/gradient_sync.h"

using namespace syncopate;
using test::init_header;
using test::push_header;

namespace {
int64_t duplicates_of(const ParameterShard& s) { return nlohmann::json::parse(s.stats_json(0))["duplicates"].get<int64_t>(); }
// A server on plain TCP that checkpoints into d/ck after every update (crash and restart tests).
ServerConfig durable_server(const test::TempDir& d) {
  ServerConfig sc;
  sc.encrypt = "off";
  sc.checkpoint_dir = d.str("ck");
  sc.checkpoint_every = 1;
  return sc;
}
}  // namespace

// Issue 26 (1): BSP, 2 workers. Worker 0 pushes clock 0 and is held; the shard is checkpointed
// (SIGTERM, SHUTDOWN, or the next push's periodic checkpoint) and restored. Worker 0's resend of
// clock 0 must still be held, and the clock applied once worker 1's gradient comes must be the
// mean of both: exactly what a shard that never restarted applies.
TEST(ParameterShard, BspCheckpointTakenWithAHeldWorkerKeepsItsGradient) {
  PsConfig c;
  c.consistency = "bsp";
  test::TempDir d;
  std::vector<float> init = {1, 2, 3, 4}, g0 = {0.5f, -1, 2, 0.25f}, g1 = {1.5f, 1, -2, 0.75f};
  ParameterShard ref(c), a(c);
  ref.init(init_header(2, 4), init.data(), nullptr, 0);
  a.init(init_header(2, 4), init.data(), nullptr, 0);
  ASSERT_TRUE(ref.push(push_header(0, 0, 0, 4), g0.data()).empty());
  ASSERT_TRUE(a.push(push_header(0, 0, 0, 4), g0.data()).empty());
  a.save(d.str("shard.safetensors"));
  ParameterShard b(c);
  ASSERT_TRUE(b.load(d.str("shard.safetensors"), 0.0));
  EXPECT_TRUE(b.push(push_header(0, 0, 0, 4), g0.data()).empty())
      << "the held worker's resend was answered at once; duplicates=" << duplicates_of(b);
  EXPECT_EQ(b.version(), 0);
  EXPECT_EQ(ref.push(push_header(1, 0, 0, 4), g1.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(b.push(push_header(1, 0, 0, 4), g1.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(b.version(), 1);
  EXPECT_TRUE(torch::equal(ref.params(), b.params())) << ref.params() << b.params();
  // The next clock goes on in step: no worker stays a clock ahead.
  ref.push(push_header(0, 1, 1, 4), g1.data());
  b.push(push_header(0, 1, 1, 4), g1.data());
  EXPECT_EQ(ref.push(push_header(1, 1, 1, 4), g0.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(b.push(push_header(1, 1, 1, 4), g0.data()), (std::vector<int>{0, 1}));
  EXPECT_TRUE(torch::equal(ref.params(), b.params())) << ref.params() << b.params();
}

// Issue 26 (1) and (5), the FINISH variant, with the server's own checkpoint policy
// (checkpoint_every=1, ShardPartitions): 3 workers; 0 and 1 push clock 0, worker 2 finishes, which
// releases clock 0 (checkpointed before its replies, as the server does); worker 0 pushes clock 1
// and is held, and the shard is checkpointed (SIGTERM). The restored shard holds worker 0's clock-1 gradient and knows worker 2
// finished, so worker 1's clock 1 completes it with the mean of both.
TEST(ShardPartitions, FinishThenAHeldPushSurviveARestart) {
  PsConfig c;
  c.consistency = "bsp";
  c.worker_timeout_s = 1000;
  test::TempDir d;
  std::vector<float> init = {1, -1, 0.5f, 2}, g0 = {0.5f, -1, 2, 0.25f}, g1 = {1.5f, 1, -2, 0.75f};
  ParameterShard ref(c);
  ShardPartitions parts(c, 0, d.str("ck"), 1);
  ref.init(init_header(3, 4), init.data(), nullptr, 0);
  ParameterShard& s = parts.init(init_header(3, 4), init.data(), nullptr, 0, 0.0);
  for (ParameterShard* x : {&ref, &s}) {
    x->push(push_header(0, 0, 0, 4), g0.data(), 1.0);
    x->push(push_header(1, 0, 0, 4), g1.data(), 1.0);
  }
  ref.finish(2);
  for (auto [shard, w] : parts.finish(2)) parts.checkpoint(*shard);
  ASSERT_EQ(s.version(), 1);
  ASSERT_TRUE(ref.push(push_header(0, 1, 1, 4), g1.data(), 2.0).empty());
  ASSERT_TRUE(s.push(push_header(0, 1, 1, 4), g1.data(), 2.0).empty());
  parts.checkpoint_all();  // SIGTERM or SHUTDOWN now (or, before issue 26 (3), this push's periodic checkpoint)
  ShardPartitions restored(c, 0, d.str("ck"), 1);
  ASSERT_EQ(restored.load(3.0), 1);
  ParameterShard& r = restored.at(push_header(0, 1, 1, 4));
  EXPECT_TRUE(r.push(push_header(0, 1, 1, 4), g1.data(), 3.0).empty())
      << "the held worker's resend was answered at once; duplicates=" << duplicates_of(r);
  EXPECT_EQ(ref.push(push_header(1, 1, 1, 4), g0.data(), 3.0), (std::vector<int>{0, 1}));
  EXPECT_EQ(r.push(push_header(1, 1, 1, 4), g0.data(), 3.0), (std::vector<int>{0, 1}))
      << "live workers after the restore: " << r.live_workers();
  EXPECT_EQ(r.version(), 2);
  EXPECT_TRUE(torch::equal(ref.params(), r.params())) << ref.params() << r.params();
}

// Issue 26 (4): BSP, worker 0 is held at clock 1 when it is killed and resumed from step 0. Its
// replay of clock 0 (applied already) is answered at once; its replay of clock 1 joins the held
// push; worker 1's clock 1 releases both.
TEST(ParameterShard, ADuplicateOfAnOlderClockIsAnsweredAtOnceWhileTheWorkerIsHeld) {
  PsConfig c;
  c.consistency = "bsp";
  std::vector<float> init(4, 1.0f), g(4, 0.5f);
  ParameterShard s(c);
  s.init(init_header(2, 4), init.data(), nullptr, 0);
  s.push(push_header(0, 0, 0, 4), g.data());
  ASSERT_EQ(s.push(push_header(1, 0, 0, 4), g.data()), (std::vector<int>{0, 1}));
  ASSERT_TRUE(s.push(push_header(0, 1, 1, 4), g.data()).empty());  // held: worker 1 owes clock 1
  s.registered(0, 0);  // worker 0 restarted from its step-0 checkpoint
  EXPECT_EQ(s.push(push_header(0, 0, 1, 4), g.data()), (std::vector<int>{0})) << "the replay of clock 0 was swallowed";
  EXPECT_TRUE(s.push(push_header(0, 1, 1, 4), g.data()).empty());  // clock 1 is still owed by worker 1
  EXPECT_EQ(s.push(push_header(1, 1, 1, 4), g.data()), (std::vector<int>{0, 1}));
  EXPECT_EQ(s.version(), 2);
  EXPECT_EQ(duplicates_of(s), 2);
}

// The same for SSP (bound 0): worker 0 is held at clock 1 until worker 1 pushes clock 1.
TEST(ParameterShard, SspAnswersAnOlderDuplicateAtOnceWhileTheWorkerIsHeld) {
  PsConfig c;
  c.consistency = "ssp";
  c.staleness_bound = 0;
  std::vector<float> init(4, 1.0f), g(4, 0.5f);
  ParameterShard s(c);
  s.init(init_header(2, 4), init.data(), nullptr, 0);
  s.push(push_header(0, 0, 0, 4), g.data());
  s.push(push_header(1, 0, 1, 4), g.data());
  ASSERT_TRUE(s.push(push_header(0, 1, 2, 4), g.data()).empty());
  s.registered(0, 0);
  EXPECT_EQ(s.push(push_header(0, 0, 3, 4), g.data()), (std::vector<int>{0}));
  EXPECT_EQ(s.version(), 3);  // answered, not applied
}

// Issue 26 (5): FINISH is part of the checkpoint. A finished worker does not count as live after
// a restore (BSP does not wait for it), and a shard whose every worker had finished is done at
// once after a restart (server.exit_when_done exits instead of hanging).
TEST(ParameterShard, FinishedWorkersStayFinishedAcrossARestore) {
  PsConfig c;
  c.consistency = "bsp";
  c.worker_timeout_s = 1000;
  test::TempDir d;
  std::vector<float> init(4, 1.0f), g(4, 0.5f);
  ParameterShard a(c);
  a.init(init_header(2, 4), init.data(), nullptr, 0);
  a.finish(1);
  a.save(d.str("a.safetensors"));
  ParameterShard b(c);
  ASSERT_TRUE(b.load(d.str("a.safetensors"), 0.0));
  EXPECT_EQ(b.live_workers(), 1);
  EXPECT_EQ(b.push(push_header(0, 0, 0, 4), g.data(), 1.0), (std::vector<int>{0}))
      << "worker 0 waits for a worker that finished before the restart";
  b.finish(0);
  ASSERT_TRUE(b.job_done());
  b.save(d.str("b.safetensors"));
  ParameterShard e(c);
  ASSERT_TRUE(e.load(d.str("b.safetensors"), 0.0));
  EXPECT_TRUE(e.job_done()) << "a shard restarted after every worker finished is not done";
  e.registered(1, 1);  // a finished worker that starts again takes part again
  e.seen(1, 1.0);
  EXPECT_FALSE(e.job_done());
}

// Issue 26 (3): durable before acknowledged. A clock that FINISH or a worker's timeout releases is
// checkpointed (server.checkpoint_every=1) before the held worker's reply leaves: once the push
// returns, the shard's file holds its update. A real server on loopback, real clients.
TEST(PsServer, ClocksReleasedByFinishOrTimeoutAreDurableBeforeTheyAreAcknowledged) {
  for (bool by_finish : {true, false}) {
    SCOPED_TRACE(by_finish ? "released by FINISH" : "released by the other worker's timeout");
    test::TempDir d;
    const ServerConfig sc = durable_server(d);
    PsConfig pc;
    pc.consistency = "bsp";
    pc.worker_timeout_s = 1.0;
    test::InProcessServer server(sc, pc, "job");
    auto pa = torch::ones({6}), g = torch::ones({6});
    PsClient a({server.endpoint}, "job", 0, 2, PsClientOptions{20});
    a.init(pa, {}, AdamWConfig{});
    {
      auto pb = torch::ones({6});
      PsClient b({server.endpoint}, "job", 1, 2, PsClientOptions{20});
      b.init(pb, {}, AdamWConfig{});
      if (by_finish) {
        std::thread later([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          b.finish(0);
        });
        push_pull(a, g, pa, 0, 0.01);
        later.join();
      }
    }  // b ends: no more heartbeats from it
    if (!by_finish) push_pull(a, g, pa, 0, 0.01);  // held until worker 1 has been silent for 1 s
    const std::string file = d.str("ck/shard_0.safetensors");
    ASSERT_TRUE(std::filesystem::exists(file)) << "clock 0 was acknowledged, and no checkpoint holds it";
    ParameterShard saved{pc};
    ASSERT_TRUE(saved.load(file, 0.0));
    EXPECT_EQ(saved.version(), 1);
    EXPECT_EQ(saved.clock(0), 0);
  }
}

// Issue 26 (8): a worker resumed from an older checkpoint replays clocks the shard applied; the
// shard discards those pushes, so with the int8 wire they must not change the residual (nothing of
// them is delivered). The residuals are what the worker checkpoints (PsSync::state()) and puts back.
TEST(PsClient, AReplayedInt8PushLeavesTheResidualAsItWas) {
  ServerConfig sc;
  sc.encrypt = "off";
  test::InProcessServer server(sc, PsConfig{}, "job");
  PsClientOptions o{10};
  o.wire = WireFormat::kInt8;
  const int64_t n = 5000;  // two int8 chunks
  auto g = torch::randn({n}), p = torch::zeros({n});
  {
    PsClient a({server.endpoint}, "job", 0, 1, o);
    a.init(p, {}, AdamWConfig{});
    for (int c = 0; c < 3; ++c) push_pull(a, g * (c + 1), p, c, 0.01);
  }
  PsClient b({server.endpoint}, "job", 0, 1, o);  // the worker again, resumed at step 1
  auto q = torch::zeros({n});
  b.init(q, {}, AdamWConfig{}, 1);
  ASSERT_EQ(b.applied_clock(), 2);
  std::vector<float> owed(static_cast<size_t>(n)), after(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) owed[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i % 13) - 0.006f;
  b.set_residuals(owed.data());
  b.residuals(after.data());
  ASSERT_EQ(after, owed);
  push_pull(b, g, q, 1, 0.01);  // a replay: answered, not applied
  b.residuals(after.data());
  EXPECT_EQ(after, owed) << "a discarded push changed the residual";
  push_pull(b, g, q, 3, 0.01);  // a new clock: error feedback goes on
  b.residuals(after.data());
  EXPECT_NE(after, owed);
  const auto stats = nlohmann::json::parse(b.stats(0));
  EXPECT_EQ(stats["duplicates"], 1) << stats.dump();
  EXPECT_EQ(stats["version"], 4) << stats.dump();
}

// Issue 26 (10): versions repeat after a restore (the restored shard counts again from its
// checkpoint's), so DC-ASGD compensated a push read before the crash against other values that
// carry the same number. Versions carry the shard's epoch (one more per restore): a read from
// before the restore matches no saved read after it, and is applied uncompensated and counted.
TEST(ParameterShard, VersionsStayDistinctAcrossARestoreAndDcAsgdNeverMatchesAnOldRead) {
  PsConfig c;
  c.mitigation = "dc_asgd";
  test::TempDir d;
  std::vector<float> init = {1, 2, 3, 4}, g = {0.5f, -0.5f, 0.25f, 1};
  ParameterShard a(c);
  a.init(init_header(2, 4), init.data(), nullptr, 0);
  a.push(push_header(0, 0, 0, 4), g.data());
  a.save(d.str("s.safetensors"));  // version 1
  a.push(push_header(1, 0, a.version(), 4), g.data());
  a.pulled(0);                      // worker 0 reads version 2 ...
  const int64_t read_before = nlohmann::json::parse(a.stats_json(0)).value("wire_version", a.version());
  ParameterShard b(c);              // ... and the shard is restored from version 1
  ASSERT_TRUE(b.load(d.str("s.safetensors"), 0.0));
  b.push(push_header(1, 0, 1, 4), g.data());  // worker 1's resend: version 2 again, other values
  b.pulled(0);
  const int64_t read_after = nlohmann::json::parse(b.stats_json(0)).value("wire_version", b.version());
  EXPECT_NE(read_after, read_before);
  EXPECT_GT(read_after, read_before);  // monotonic across the restore
  auto uncompensated = [&] { return nlohmann::json::parse(b.stats_json(0))["dc_uncompensated"].get<int64_t>(); };
  const int64_t before = uncompensated();  // worker 1's push above: no read of it kept
  b.push(push_header(0, 1, read_before, 4), g.data());  // computed on the read from before the crash
  EXPECT_EQ(uncompensated(), before + 1) << "compensated against values that only share the version number";
}

// Found by the crash sweep under load (SSP, a kill after "applied"): a restarted server releases a
// held worker (restored from the checkpoint) when another worker's push completes its clock, before
// the held worker has sent anything to the new process. The reply has nowhere to go; it threw
// (map::at) and the pusher got "internal error" and stopped. Now the reply is skipped and the held
// worker's resend is answered. SSP bound 0, 2 workers: A pushes clock 0 and is held; the server is
// shut down (checkpointed) and started again on its port; B pushes clock 0 before A resends.
TEST(PsServer, ARestoredHeldWorkerUnknownToTheNewProcessGetsItsReplyOnResend) {
  test::TempDir d;
  ServerConfig sc = durable_server(d);
  PsConfig pc;
  pc.consistency = "ssp";
  pc.staleness_bound = 0;
  auto server = std::make_unique<test::InProcessServer>(sc, pc, "job");
  const std::string ep = server->endpoint;
  PsClientOptions slow_resend{60};
  slow_resend.first_resend_s = 5;  // A stays silent towards the new process until B's push is in
  PsClient a({ep}, "job", 0, 2, slow_resend), b({ep}, "job", 1, 2, PsClientOptions{30});
  auto pa = torch::ones({8}), pb = torch::ones({8}), g = torch::full({8}, 0.5);
  a.init(pa, {}, AdamWConfig{});
  b.init(pb, {}, AdamWConfig{});
  const PsTicket held = a.push(0, g, 0, 0.01);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // applied, checkpointed, reply held
  server.reset();                                               // SHUTDOWN: checkpointed, joined
  sc.port = std::stoll(ep.substr(ep.rfind(':') + 1));
  server = std::make_unique<test::InProcessServer>(sc, pc, "job");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(push_pull(b, g, pb, 0, 0.01));  // completes clock 0: releases A, unknown to this process
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.0)
      << "B's push was answered only after A's resend: the test did not exercise the release";
  PsReply r;
  EXPECT_NO_THROW(r = a.wait(held, pa));
  const auto j = nlohmann::json::parse(b.stats(0));
  EXPECT_EQ(j["version"], 2) << j.dump();
  EXPECT_EQ(j["bad_messages"], 0) << j.dump();
  EXPECT_TRUE(torch::equal(pa, pb)) << pa << pb;
}

// A switch into ps mode from another synchronization (worker/train/mode_switch.h) must find shards
// that start from the job's weights: fresh shards (defined by a worker's INIT) pass
// check_switched_shards; shards restored from checkpoints of an earlier ps phase are refused by
// name (their weights would take the job back there).
TEST(PsClient, ASwitchIntoPsRefusesShardsRestoredFromAnEarlierPhase) {
  test::TempDir d;
  ServerConfig sc = durable_server(d);
  auto server = std::make_unique<test::InProcessServer>(sc, PsConfig{}, "job");
  const std::string ep = server->endpoint;
  {
    PsClient fresh({ep}, "job", 0, 1, PsClientOptions{30});
    auto p = torch::ones({8});
    fresh.init(p, {}, AdamWConfig{});
    EXPECT_EQ(fresh.restored_epoch(), 0);
    EXPECT_NO_THROW(check_switched_shards(fresh, 4));
    push_pull(fresh, torch::full({8}, 0.5), p, 0, 0.01);
  }
  server.reset();  // SHUTDOWN: checkpointed
  sc.port = std::stoll(ep.substr(ep.rfind(':') + 1));
  server = std::make_unique<test::InProcessServer>(sc, PsConfig{}, "job");
  PsClient later({ep}, "job", 0, 1, PsClientOptions{30});
  auto p = torch::ones({8});
  later.init(p, {}, AdamWConfig{});
  EXPECT_GT(later.restored_epoch(), 0);
  const std::string e = test::error_of([&] { check_switched_shards(later, 8); });
  EXPECT_NE(e.find("resumes step 8 in ps mode after another synchronization, but the shards restored checkpoints"),
            std::string::npos) << e;
  EXPECT_NE(e.find("remove the shards' checkpoints"), std::string::npos) << e;
}

// server.checkpoint_background with a modelled write (server.checkpoint_s): pushes are answered
// at once although every one makes a checkpoint due (checkpoint_every=1); a new partition's INIT
// waits for the write that holds its creation; a FINISH is answered at once too, made durable by a
// record of the membership journal: once it returns, the directory (the files and the journal, as a
// restart reads them) says the worker finished, although no write of the state held it yet.
TEST(PsServer, WithBackgroundCheckpointsPushesAndAFinishGoOnAndTheFinishIsInTheJournal) {
  test::TempDir d;
  ServerConfig sc = durable_server(d);
  sc.checkpoint_background = true;
  sc.checkpoint_s = 0.8;
  PsConfig pc;
  pc.consistency = "asp";
  pc.worker_timeout_s = 1000;
  test::InProcessServer server(sc, pc, "job");
  auto since = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto pa = torch::ones({6}), pb = torch::ones({6}), g = torch::ones({6});
  PsClient a({server.endpoint}, "job", 0, 2, PsClientOptions{20});
  auto t0 = std::chrono::steady_clock::now();
  a.init(pa, {}, AdamWConfig{});
  EXPECT_GE(since(t0), 0.75) << "the INIT that created the partition was answered before its checkpoint was written";
  PsClientOptions resends_often{20};
  resends_often.first_resend_s = 0.15;  // its FINISH is resent while it waits: no copy is answered early
  PsClient b({server.endpoint}, "job", 1, 2, resends_often);
  b.init(pb, {}, AdamWConfig{});
  double slowest = 0;
  for (int64_t c = 0; c < 6; ++c) {  // a snapshot is wanted at every push; none of them waits for one
    t0 = std::chrono::steady_clock::now();
    push_pull(a, g, pa, c, 0.01);
    slowest = std::max(slowest, since(t0));
  }
  EXPECT_LT(slowest, 0.4) << "a push waited for a background checkpoint";
  t0 = std::chrono::steady_clock::now();
  b.finish(0);
  EXPECT_LT(since(t0), 0.4) << "FINISH waited for a write of the state";
  ParameterShard in_place{pc};
  ASSERT_TRUE(in_place.load(d.str("ck/shard_0.safetensors"), 0.0));
  EXPECT_EQ(in_place.live_workers(), 2) << "a write of the state held the FINISH already: the journal is not tested";
  std::filesystem::copy(d.str("ck"), d.str("ck_now"));  // what a restart would read now (a copy: the server writes on)
  ShardPartitions restored(pc, 0, d.str("ck_now"), 1 << 30);
  ASSERT_EQ(restored.load(0), 1);
  MsgHeader any;
  any.offset = 0;
  any.length = 6;
  EXPECT_EQ(restored.at(any).live_workers(), 1) << "the FINISH it acknowledged is not durable";
}
