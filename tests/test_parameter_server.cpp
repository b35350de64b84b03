// Parameter servers: the shard's consistency rules (transport-free), the header decoder against
// garbage, a live server under hostile messages, and real processes: one ASP worker equals
// single-process training, BSP over the servers equals the ring.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <iostream>
#include <optional>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/check.h"
#include "server/ps_protocol.h"
#include "common/safetensors.h"
#include "common/comm/transport/tcp_connection.h"
#include "server/parameter_shard.h"
#include "server/ps_server.h"
#include "tests/test_helpers.h"
#include "tests/ps_test_messages.h"
#include "tests/ps_in_process_server.h"
#include "server/ps_client.h"
#include "server/zmtp_greeting.h"
#include "server/ps_keys.h"
#include "model/gpt_config.h"
#include "model/flat_parameters.h"
#include "common/comm/sharding.h"
#include "common/comm/wire_format.h"
#include "worker/sync/gradient_sync.h"

using namespace syncopate;

namespace {
using test::init_header;
using test::push_header;
// A test client's options for servers of job `token`: encrypted with the token-derived key (as
// every worker and server of a job with a token is by default), or plain.
PsClientOptions client_options(const std::string& token, bool encrypted) {
  PsClientOptions o{10};
  o.curve_server_key = ps_client_server_key(token, encrypted ? "auto" : "off");
  return o;
}

using test::InProcessServer;
}  // namespace

TEST(ParameterShard, BspWaitsForEveryWorkerAndAppliesTheMeanOnce) {
  PsConfig c;
  c.consistency = "bsp";
  ParameterShard s(c);
  std::vector<float> init(4, 1.0f), g0(4, 1.0f), g1(4, 3.0f);
  s.init(init_header(2, 4), init.data(), nullptr, 0);
  EXPECT_TRUE(s.push(push_header(0, 0, 0, 4), g0.data()).empty());  // held back
  EXPECT_EQ(s.version(), 0);
  auto ready = s.push(push_header(1, 0, 0, 4), g1.data());
  EXPECT_EQ(ready, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.version(), 1);
  // One AdamW step on the mean gradient (2.0): the first step moves every weight by lr.
  EXPECT_TRUE(torch::allclose(s.params(), torch::full({4}, 1.0f - 0.1f), 1e-6, 1e-6)) << s.params();
}

// Backup workers (Chen et al. 2016): with 3 workers and b = 1, a clock is applied once 2 gradients
// computed on the current parameters have come (their mean); the third, computed on the old
// parameters, is dropped, counted, answered at once, and never applied, now or later.
TEST(ParameterShard, BspWithBackupWorkersAppliesTheFirstWMinusBAndDropsTheLate) {
  PsConfig c;
  c.consistency = "bsp";
  c.backup_workers = 1;
  ParameterShard s(c), ref(PsConfig{});  // ref: ASP, fed exactly the gradients that must be used
  std::vector<float> init(4, 1.0f), g0(4, 1.0f), g1(4, 3.0f), g2(4, -50.0f), mean(4, 2.0f);
  s.init(init_header(3, 4), init.data(), nullptr, 0);
  ref.init(init_header(1, 4), init.data(), nullptr, 0);
  EXPECT_TRUE(s.push(push_header(0, 0, 0, 4), g0.data()).empty());
  auto ready = s.push(push_header(1, 0, 0, 4), g1.data());
  EXPECT_EQ(ready, (std::vector<int>{0, 1}));  // 3 - 1 = 2 have come: applied, both released
  EXPECT_EQ(s.version(), 1);
  ref.push(push_header(0, 0, 0, 4), mean.data());
  EXPECT_TRUE(torch::equal(s.params(), ref.params())) << s.params() << ref.params();
  // The late worker's gradient of clock 0 (on version 0): dropped, answered at once.
  EXPECT_EQ(s.push(push_header(2, 0, 0, 4), g2.data()), (std::vector<int>{2}));
  EXPECT_EQ(s.dropped(), 1);
  EXPECT_EQ(s.version(), 1);
  EXPECT_TRUE(torch::equal(s.params(), ref.params()));
  // A resend of the same late push is a duplicate, not a second drop and never an update.
  EXPECT_EQ(s.push(push_header(2, 0, 0, 4), g2.data()), (std::vector<int>{2}));
  EXPECT_EQ(s.dropped(), 1);
  // Next clock: the late worker is on time now and counts; worker 0 is the one left out.
  EXPECT_TRUE(s.push(push_header(2, 1, 1, 4), g1.data()).empty());
  EXPECT_EQ(s.push(push_header(1, 1, 1, 4), g0.data()), (std::vector<int>{1, 2}));
  EXPECT_EQ(s.version(), 2);
  ref.push(push_header(0, 1, 1, 4), mean.data());
  EXPECT_TRUE(torch::equal(s.params(), ref.params()));
  EXPECT_EQ(s.push(push_header(0, 1, 1, 4), g2.data()), (std::vector<int>{0}));
  EXPECT_EQ(s.dropped(), 2);
  EXPECT_TRUE(torch::equal(s.params(), ref.params()));
  EXPECT_NE(s.stats_json(0).find("\"dropped\":2"), std::string::npos) << s.stats_json(0);
  // The staleness histogram counts the 4 gradients used (all fresh), not the 2 dropped ones.
  EXPECT_NE(s.stats_json(0).find("\"staleness_histogram\":{\"0\":4}"), std::string::npos) << s.stats_json(0);
}

// Protocol 9's `round`: the job's frontier under BSP, whoever is live. A late worker's held push of an
// older clock does not move it back, and once the others finished it stays where they left it (the
// live workers' round would fall to the late worker's own clock: what the slow node saw before).
TEST(ParameterShard, TheRoundIsTheJobsFrontierWhoeverIsLive) {
  PsConfig c;
  c.consistency = "bsp";
  c.backup_workers = 1;
  ParameterShard s(c), asp(PsConfig{});
  std::vector<float> init(4, 1.0f), g(4, 1.0f);
  EXPECT_EQ(s.round(), -1);  // not initialized
  s.init(init_header(3, 4), init.data(), nullptr, 0);
  asp.init(init_header(3, 4), init.data(), nullptr, 0);
  auto push = [&](int w, int64_t clock, int64_t version) { return s.push(push_header(w, clock, version, 4), g.data(), 1.0); };
  EXPECT_EQ(s.round(), 0);
  EXPECT_TRUE(push(0, 0, 0).empty());
  EXPECT_EQ(s.round(), 0);  // clock 0 is being collected
  push(1, 0, 0);
  EXPECT_EQ(s.round(), 1);  // applied
  push(2, 0, 0);            // late: dropped
  EXPECT_EQ(s.dropped(), 1);
  EXPECT_EQ(s.round(), 1);
  EXPECT_TRUE(push(2, 1, 1).empty());  // on time now, held in round 1
  EXPECT_EQ(s.round(), 1);
  push(0, 1, 1);
  EXPECT_EQ(s.round(), 2);
  EXPECT_TRUE(push(0, 2, 2).empty());
  push(1, 2, 2);
  EXPECT_EQ(s.round(), 3);
  s.finish(0);
  s.finish(1);
  EXPECT_EQ(s.live_workers(), 1);
  EXPECT_EQ(s.round(), 3);  // worker 2 (its clock 1) is not the job's frontier
  EXPECT_EQ(asp.round(), -1);  // SSP and ASP have no rounds
}

// The end of a BSP job with backup workers. A worker dropped once its round had been applied gets
// the newest parameters with its reply, so its next push, fresh by version, counts in the round
// after its own clock: it stays a round behind. At the job's end its last push then needs a round
// that only a worker done pushing could complete; node 0 was such a worker while it waited for the
// others to finish before scoring the final weights (FINISH after its last read), so the late
// worker waited dist.timeout_s (60 s, seen in an emulated 4-node run) and node 0 gave up waiting.
// FINISH still reading takes node 0 out of the rounds at once and keeps the shard up for its read.
TEST(ParameterShard, AWorkerThatLeftTheRoundsStillReadingHoldsNoRoundAndKeepsTheShardUp) {
  PsConfig c;
  c.consistency = "bsp";
  c.backup_workers = 1;
  c.worker_timeout_s = 5;
  ParameterShard s(c);
  std::vector<float> init(4, 1.0f), g(4, 1.0f);
  s.init(init_header(3, 4), init.data(), nullptr, 0);
  auto push = [&](int w, int64_t clock, int64_t version) { return s.push(push_header(w, clock, version, 4), g.data(), 1.0); };
  EXPECT_TRUE(push(0, 0, 0).empty());
  EXPECT_EQ(push(1, 0, 0), (std::vector<int>{0, 1}));
  EXPECT_TRUE(push(0, 1, 1).empty());
  EXPECT_EQ(push(1, 1, 1), (std::vector<int>{0, 1}));
  EXPECT_EQ(push(2, 0, 0), (std::vector<int>{2}));  // late: dropped, answered with version 2
  EXPECT_TRUE(push(2, 1, 2).empty());                // fresh by version: it counts in round 2
  EXPECT_EQ(push(0, 2, 2), (std::vector<int>{0, 2}));  // round 2: worker 2's clock 1 and worker 0's clock 2
  EXPECT_EQ(push(1, 2, 2), (std::vector<int>{1}));     // late: dropped
  EXPECT_TRUE(s.finish(1).empty());                    // worker 1 is done
  EXPECT_TRUE(s.finish(0, /*still_reading=*/true).empty());  // node 0 waits to score: out of the rounds
  const int64_t v = s.version();
  // Worker 2's last push (clock 2, on the newest version) is now a round of its own, not held.
  EXPECT_EQ(push(2, 2, v), (std::vector<int>{2}));
  EXPECT_EQ(s.version(), v + 1);
  // A heartbeat of the worker that still reads does not bring it back into the count.
  s.seen(0, 2.0);
  EXPECT_EQ(s.live_workers(), 1);
  EXPECT_FALSE(s.job_done()) << "worker 2 has not finished";
  EXPECT_TRUE(s.finish(2).empty());
  EXPECT_FALSE(s.job_done()) << "node 0 still reads: the shard must stay up for its last pull";
  EXPECT_NE(s.stats_json(2.0).find("\"reading\":[true,false,false]"), std::string::npos) << s.stats_json(2.0);
  EXPECT_TRUE(s.finish(0).empty());
  EXPECT_TRUE(s.job_done());

  // A checkpoint keeps it: a restored shard neither counts the reader in a round nor ends the job
  // before its last read (review helper-30: a restart lost the flag).
  {
    std::vector<float> g3(4, 1.0f);
    ParameterShard a(c);
    a.init(init_header(3, 4), init.data(), nullptr, 0);
    a.finish(0, /*still_reading=*/true);
    a.finish(1);
    test::TempDir dir;
    const std::string path = dir.str("shard.safetensors");
    a.save(path);
    ParameterShard b(c);
    ASSERT_TRUE(b.load(path, 10.0));
    EXPECT_EQ(b.live_workers(), 1);  // worker 2 alone
    EXPECT_EQ(b.push(push_header(2, 0, 0, 4), g3.data(), 10.0), (std::vector<int>{2}));  // a round of its own, not held
    b.finish(2);
    EXPECT_FALSE(b.job_done()) << "worker 0 still reads after the restore";
    b.expire(14.0);
    EXPECT_FALSE(b.job_done()) << "restored readers get worker_timeout_s from the restore";
    b.expire(15.5);
    EXPECT_TRUE(b.job_done());
  }
  // Still reading asked while its push is held: it leaves the count once that round releases it.
  {
    PsConfig plain;
    plain.consistency = "bsp";
    ParameterShard h(plain);
    h.init(init_header(3, 4), init.data(), nullptr, 0);
    EXPECT_TRUE(h.push(push_header(0, 0, 0, 4), g.data(), 1.0).empty());
    EXPECT_TRUE(h.finish(0, /*still_reading=*/true).empty());
    EXPECT_EQ(h.live_workers(), 3) << "held in the round: it is part of it";
    h.push(push_header(1, 0, 0, 4), g.data(), 1.0);
    EXPECT_EQ(h.push(push_header(2, 0, 0, 4), g.data(), 1.0).size(), 3u);
    EXPECT_EQ(h.live_workers(), 2);
    EXPECT_TRUE(h.push(push_header(1, 1, 1, 4), g.data(), 1.0).empty());
    EXPECT_EQ(h.push(push_header(2, 1, 1, 4), g.data(), 1.0), (std::vector<int>{1, 2})) << "round 1 without worker 0";
    // Its pushes are over: a new clock is refused by name, changing nothing; a resend of its last is answered.
    EXPECT_EQ(h.push(push_header(0, 0, 0, 4), g.data(), 1.0), (std::vector<int>{0}));
    try {
      h.push(push_header(0, 1, 2, 4), g.data(), 1.0);
      ADD_FAILURE() << "a push after FINISH still reading was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("after it left the rounds"), std::string::npos) << e.what();
    }
    EXPECT_EQ(h.version(), 2);
  }

  // Node 0 dies while it reads: once silent past worker_timeout_s the job is over without it.
  ParameterShard t(c);
  t.init(init_header(3, 4), init.data(), nullptr, 0);
  t.finish(1);
  t.finish(2);
  t.finish(0, /*still_reading=*/true);
  t.seen_reading(0, 3.0);  // its STATS polls keep it alive
  t.expire(7.0);
  EXPECT_FALSE(t.job_done());
  t.expire(8.5);
  EXPECT_TRUE(t.job_done());
}

TEST(ParameterShard, BackupWorkersNeedBspAndFewerThanTheWorkers) {
  std::vector<float> init(2, 0.0f);
  PsConfig too_many;
  too_many.consistency = "bsp";
  too_many.backup_workers = 2;
  ParameterShard a(too_many);
  EXPECT_THROW(a.init(init_header(2, 2), init.data(), nullptr, 0), Error);
  PsConfig async;
  async.backup_workers = 1;  // asp
  ParameterShard b(async);
  EXPECT_THROW(b.init(init_header(3, 2), init.data(), nullptr, 0), Error);
}

// A reply holds a reference to the parameters while ZeroMQ sends them (no copy); an update meanwhile
// must not change what is being sent, and must still land in the shard.
TEST(ParameterShard, UpdateDuringAnInFlightReplyCopiesOnWrite) {
  ParameterShard s(PsConfig{});  // asp
  std::vector<float> init(3, 1.0f), g(3, 1.0f);
  s.init(init_header(1, 3), init.data(), nullptr, 0);
  const at::Tensor in_flight = s.params();  // what ps_server's zero-copy message holds
  const float* sent = in_flight.data_ptr<float>();
  s.push(push_header(0, 0, 0, 3), g.data());
  EXPECT_TRUE(torch::equal(in_flight, torch::ones({3})));  // the bytes on the wire are unchanged
  EXPECT_NE(s.params().data_ptr<float>(), sent);
  EXPECT_TRUE(torch::allclose(s.params(), torch::full({3}, 0.9f), 1e-6, 1e-6)) << s.params();
  const float* now = s.params().data_ptr<float>();
  s.push(push_header(0, 1, 1, 3), g.data());  // no reply in flight: updated in place, no copy
  EXPECT_EQ(s.params().data_ptr<float>(), now);
}

// torch's own AdamW (weight decay 0, the shard's default betas and eps) over a sequence of
// gradients and learning rates: the independent reference for the mitigation tests. Returns the
// weights before the first step and after each one.
static std::vector<torch::Tensor> torch_adamw(torch::Tensor w0, const std::vector<std::pair<torch::Tensor, double>>& steps) {
  const MsgHeader d;  // the AdamW settings an INIT carries by default
  torch::Tensor w = w0.clone().set_requires_grad(true);
  torch::optim::AdamW opt({w}, torch::optim::AdamWOptions(0.1).betas({d.beta1, d.beta2}).eps(d.eps).weight_decay(0.0));
  std::vector<torch::Tensor> out{w0.clone()};
  for (const auto& [g, lr] : steps) {
    static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options()).lr(lr);
    w.mutable_grad() = g.clone();
    opt.step();
    out.push_back(w.detach().clone());
  }
  return out;
}

// The mitigations against a hand-computed reference (torch's AdamW fed the gradient and learning
// rate that the rule prescribes), and against no mitigation (the rule must matter).
TEST(ParameterShard, MitigationsApplyTheirRuleExactly) {
  std::vector<float> init = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<float> g0 = {0.3f, -0.2f, 0.1f, 0.4f}, g1 = {1.0f, 2.0f, -3.0f, 0.5f};
  const torch::Tensor w0 = torch::tensor(init), tg0 = torch::tensor(g0), tg1 = torch::tensor(g1);
  for (const std::string mitigation : {"dc_asgd", "lr_scale"}) {
    PsConfig c;  // asp
    c.mitigation = mitigation;
    c.dc_lambda = 0.5;
    ParameterShard s(c);
    s.init(init_header(2, 4), init.data(), nullptr, 0);
    s.pulled(0), s.pulled(1);                               // both read version 0 (w0)
    s.push(push_header(0, 0, 0, 4), g0.data());             // -> v1
    s.pulled(0);
    s.push(push_header(0, 1, 1, 4), g0.data());             // -> v2
    s.push(push_header(1, 0, 0, 4), g1.data());             // computed on v0: staleness 2
    // By hand: two plain steps, then the third with the rule applied.
    const auto w = torch_adamw(w0, {{tg0, 0.1}, {tg0, 0.1}});
    std::pair<torch::Tensor, double> third{tg1, 0.1};
    if (mitigation == "lr_scale") third.second = 0.1 / 2;  // divided by the staleness
    else third.first = tg1 + 0.5 * tg1 * tg1 * (w[2] - w0);  // g + lambda * g * g * (w_now - w_backup)
    const auto ref = torch_adamw(w0, {{tg0, 0.1}, {tg0, 0.1}, third});
    EXPECT_TRUE(torch::allclose(s.params(), ref[3], 1e-6, 1e-7)) << mitigation << "\n" << s.params() << ref[3];
    const auto plain = torch_adamw(w0, {{tg0, 0.1}, {tg0, 0.1}, {tg1, 0.1}});
    EXPECT_FALSE(torch::allclose(s.params(), plain[3], 1e-5, 1e-6)) << mitigation;
  }
}

// Issue 15 (8): DC-ASGD compensates against the parameters the gradient was computed on, which
// with dist.ps_overlap are those of the read before last. End to end: PsSync with ps_overlap
// against a live server (ASP, DC-ASGD), four steps with fixed gradients, against the hand-computed
// sequence. Step t >= 1 pushes a gradient computed on w_{t-1} while the server holds w_t, so each
// compensation is lambda * g * g * (w_t - w_{t-1}); a shard that took the last read as the backup
// compensates by zero and ends elsewhere.
TEST(PsSync, OverlapWithDcAsgdCompensatesAgainstTheWeightsTheGradientSaw) {
  PsConfig pc;
  pc.mitigation = "dc_asgd";
  pc.dc_lambda = 0.5;
  InProcessServer server(ServerConfig{}, pc, "t");
  torch::manual_seed(15);
  torch::nn::Linear model(3, 2);
  FlatParameters flat(*model);
  const torch::Tensor w0 = flat.params.clone();
  SyncSetup setup;
  setup.dist.mode = "ps";
  setup.dist.servers = server.endpoint;
  setup.dist.nnodes = 1;
  setup.dist.node_rank = 0;
  setup.dist.ps_overlap = true;
  setup.optim.grad_clip = 0;
  setup.optim.weight_decay = 0;
  setup.token = "t";
  auto sync = make_gradient_sync(setup, flat, model->parameters());
  sync->start(flat.params, 0);
  ASSERT_TRUE(torch::equal(flat.params, w0));
  const double lr = 0.1;
  std::vector<torch::Tensor> g;
  for (int t = 0; t < 4; ++t) g.push_back(torch::randn({flat.numel()}));
  std::vector<double> staleness;
  for (int t = 0; t < 4; ++t) {
    sync->begin_last_backward(lr, t);
    flat.grads.copy_(g[static_cast<size_t>(t)]);
    staleness.push_back(sync->finish_step(flat.params, flat.grads, lr, t).staleness);
  }
  sync->synchronize(flat.params);
  // By hand: w1 = AdamW(w0, g0); w_{t+1} = AdamW(w_t, g_t + lambda g_t^2 (w_t - w_{t-1})).
  std::vector<torch::Tensor> w{w0};
  std::vector<std::pair<torch::Tensor, double>> applied;
  for (size_t t = 0; t < 4; ++t) {
    applied.emplace_back(t == 0 ? g[0] : g[t] + 0.5 * g[t] * g[t] * (w[t] - w[t - 1]), lr);
    w.push_back(torch_adamw(w0, applied).back());
  }
  EXPECT_TRUE(torch::allclose(flat.params, w[4], 1e-5, 1e-6)) << flat.params << w[4];
  std::vector<std::pair<torch::Tensor, double>> uncompensated;
  for (size_t t = 0; t < 4; ++t) uncompensated.emplace_back(g[t], lr);
  EXPECT_FALSE(torch::allclose(flat.params, torch_adamw(w0, uncompensated).back(), 1e-5, 1e-6));
  // Every round trip but the first saw one update between read and push (reported a step later).
  EXPECT_EQ(staleness, (std::vector<double>{0, 0, 1, 1}));
  PsClient c({server.endpoint}, "t", 0, 1, client_options("t", true));
  const auto stats = nlohmann::json::parse(c.stats(0));
  EXPECT_EQ(stats["dc_uncompensated"], 0) << stats.dump();
  EXPECT_EQ(stats["version"], 4);
}

// A shard takes the wire format its first INIT names and refuses pushes (and INITs) of another.
TEST(ParameterShard, RefusesMixedWireFormats) {
  ParameterShard s(PsConfig{});
  MsgHeader init = init_header(2, 4);
  init.wire = "i8";
  std::vector<float> v(4, 0.0f);
  s.init(init, v.data(), nullptr, 0);
  EXPECT_EQ(s.wire(), "i8");
  MsgHeader push = push_header(1, 0, 0, 4);  // dtype f32
  EXPECT_NE(test::error_of([&] { s.check(push); }).find("a push of dtype 'f32' to a shard whose workers agreed on 'i8'"),
            std::string::npos);
  push.dtype = "i8";
  EXPECT_NO_THROW(s.check(push));
  MsgHeader other = init;
  other.worker = 1;
  other.wire = "bf16";
  EXPECT_NE(test::error_of([&] { s.init(other, v.data(), nullptr, 0); }).find("mixed formats are refused"), std::string::npos);
  other.wire = "q4";
  ParameterShard fresh(PsConfig{});
  EXPECT_NE(test::error_of([&] { fresh.init(other, v.data(), nullptr, 0); }).find("dtype 'q4' is not a wire format"),
            std::string::npos);
}

TEST(ParameterShard, AspStalenessHistogramMatchesTheSchedule) {
  ParameterShard s(PsConfig{});  // asp
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(init_header(2, 2), init.data(), nullptr, 0);
  // Worker 0 pulls v0 and pushes every step; worker 1 computes on v0 and pushes after 3 updates.
  s.push(push_header(0, 0, 0, 2), g.data());  // staleness 0 -> v1
  s.push(push_header(0, 1, 1, 2), g.data());  // 0 -> v2
  s.push(push_header(0, 2, 2, 2), g.data());  // 0 -> v3
  s.push(push_header(1, 0, 0, 2), g.data());  // 3 -> v4
  s.push(push_header(0, 3, 3, 2), g.data());  // 1 -> v5
  auto stats = nlohmann::json::parse(s.stats_json(0));
  EXPECT_EQ(stats["staleness_histogram"], (nlohmann::json{{"0", 3}, {"1", 1}, {"3", 1}}));
  EXPECT_EQ(stats["version"], 5);
  EXPECT_EQ(s.last_staleness(1), 3);
}

TEST(ParameterShard, SspNeverLetsAWorkerRunMoreThanTheBoundAhead) {
  PsConfig c;
  c.consistency = "ssp";
  c.staleness_bound = 2;
  ParameterShard s(c);
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(init_header(2, 2), init.data(), nullptr, 0);
  // Worker 1 is slow: worker 0 keeps pushing; it must be held once it is 3 clocks ahead.
  std::vector<int64_t> clocks = {-1, -1};
  bool held = false;
  int64_t next0 = 0, next1 = 0;
  for (int round = 0; round < 12; ++round) {
    if (!held) {
      auto r = s.push(push_header(0, next0, s.version(), 2), g.data());
      clocks[0] = next0++;
      held = std::find(r.begin(), r.end(), 0) == r.end();
    }
    if (round % 3 == 2) {  // the slow worker pushes every third round
      auto r = s.push(push_header(1, next1, s.version(), 2), g.data());
      clocks[1] = next1++;
      if (std::find(r.begin(), r.end(), 0) != r.end()) held = false;  // released
    }
    // A worker proceeds past clock c only if c - slowest <= s.
    if (!held) {
      EXPECT_LE(clocks[0] - clocks[1], c.staleness_bound) << "round " << round;
    }
  }
  EXPECT_GT(next0, next1);  // the fast worker did run ahead, within the bound
}

TEST(ParameterShard, RejectsMismatchedRangesWorkersAndVersions) {
  ParameterShard s(PsConfig{});
  std::vector<float> init(4, 0.0f), g(4, 1.0f);
  s.init(init_header(2, 4), init.data(), nullptr, 0);
  auto bad = push_header(0, 0, 0, 4);
  bad.length = 3;
  EXPECT_THROW(s.push(bad, g.data()), Error);
  EXPECT_THROW(s.push(push_header(5, 0, 0, 4), g.data()), Error);   // no such worker
  EXPECT_THROW(s.push(push_header(0, -1, 0, 4), g.data()), Error);  // negative clock
  auto nan_lr = push_header(0, 0, 0, 4);
  nan_lr.lr = std::nan("");
  EXPECT_THROW(s.push(nan_lr, g.data()), Error);
  EXPECT_THROW(s.init(init_header(3, 4), init.data(), nullptr, 0), Error);  // other worker count
  EXPECT_EQ(s.version(), 0);
}

TEST(PsProtocol, DecoderSurvivesRandomBytes) {
  std::mt19937 rng(7);
  int rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string junk(rng() % 200, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    if (i % 4 == 0 && junk.size() > 2) junk[0] = static_cast<char>(0x80 | (rng() % 16));  // msgpack map prefix
    try {
      decode_header(junk.data(), junk.size());
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 19000);
  MsgHeader h;
  h.type = static_cast<int>(MsgType::kPull);
  h.length = 5;
  std::string enc = encode_header(h);
  EXPECT_EQ(decode_header(enc.data(), enc.size()).length, 5);
  std::string big(kMaxHeaderBytes + 1, 'x');
  EXPECT_THROW(decode_header(big.data(), big.size()), Error);
}

TEST(PsServer, HostileMessagesGetErrorRepliesAndTheServerKeepsServing) {
  ServerConfig sc;
  sc.encrypt = "off";  // a plain DEALER speaks to the dispatcher directly
  InProcessServer server(sc, PsConfig{}, "job");
  const std::string endpoint = server.endpoint;
  {
    zmq::context_t ctx;
    zmq::socket_t s = server.dealer(ctx);
    auto expect_error = [&](std::vector<std::string> frames, const std::string& needle) {
      for (size_t i = 0; i < frames.size(); ++i)
        s.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      std::vector<zmq::message_t> parts;
      ASSERT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)));
      MsgHeader r = decode_header(parts[0].data(), parts[0].size());
      EXPECT_EQ(r.type, static_cast<int>(MsgType::kError));
      EXPECT_NE(r.text.find(needle), std::string::npos) << r.text;
    };
    expect_error({"\x01\x02garbage"}, "msgpack");
    MsgHeader h;
    h.type = static_cast<int>(MsgType::kPull);
    h.token = token_digest("other-job");
    expect_error({encode_header(h)}, "wrong job token");
    h.token = token_digest("job");
    expect_error({encode_header(h)}, "not initialized");
    h.type = 77;
    expect_error({encode_header(h)}, "unknown message type");
    expect_error({"a", "b", "c", "d"}, "frames");
  }
  // A real client still works afterwards.
  PsClient c({endpoint}, "job", 0, 1, PsClientOptions{10});
  auto params = torch::ones({10});
  c.init(params, {}, AdamWConfig{});
  auto grads = torch::ones({10});
  push_pull(c, grads, params, 0, 0.01);
  auto stats = nlohmann::json::parse(c.stats(0));
  EXPECT_EQ(stats["version"], 1);
  EXPECT_EQ(stats["bad_messages"], 5);
  EXPECT_LT(params[0].item<float>(), 1.0f);
}

namespace {
const std::string kBin = test::bin_dir();  // the worker and server binaries (SYNCOPATE_TEST_BIN: another build)

std::vector<std::string> train_args(const test::TempDir& d, const std::string& corpus, const std::string& out, int batch) {
  return {kBin + "/syncopate-worker", "--out", out, "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32",
          "--train.threads=1", "--schedule.warmup_steps=2", "--eval.every=0", "--eval.batches=1",
          "--eval.sample_tokens=0", "--checkpoint.every=0", "--data.corpus=" + corpus,
          "--data.cache_dir=" + d.str("cache"), "--train.steps=6", "--optim.grad_clip=0",
          "--train.batch_size=" + std::to_string(batch)};
}
at::Tensor weights(const std::string& out) {
  auto st = load_safetensors(out + "/checkpoints/step_000006/model.safetensors");
  std::vector<at::Tensor> all;
  for (auto& [n, t] : st.tensors) all.push_back(t.reshape(-1));
  return torch::cat(all);
}
// Starts syncopate-server (job token "t") with `args` on any free port and waits until it listens;
// *endpoint receives where.
std::unique_ptr<test::Process> start_server(const test::TempDir& d, std::vector<std::string> args, const std::string& log,
                                            std::string* endpoint, const std::vector<std::string>& env = {}) {
  const test::ServerPort port = test::any_server_port(d);
  args.insert(args.begin(), kBin + "/syncopate-server");
  args.insert(args.end(), port.args.begin(), port.args.end());
  std::vector<std::string> e{"SYNCOPATE_TOKEN=t"};
  e.insert(e.end(), env.begin(), env.end());
  auto p = std::make_unique<test::Process>(args, e, log);
  *endpoint = test::wait_for_line(port.endpoint_file, 60, p.get());
  return p;
}
// One node of a parameter-server job (mode ps, 2 steps, against the server at `ep`) with extra
// worker flags and environment, run to its end: its exit code (-1: still running after 60 s, -2:
// killed by a signal) and its log (d/<name>.log).
struct NodeEnd {
  int rc;
  std::string log;
};
NodeEnd run_ps_node(const test::TempDir& d, const std::string& corpus, const std::string& ep, const std::string& name,
                    const std::vector<std::string>& flags, const std::vector<std::string>& env) {
  auto a = train_args(d, corpus, d.str(name), 2);
  a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + ep});
  a.insert(a.end(), flags.begin(), flags.end());
  std::vector<std::string> e{"SYNCOPATE_TOKEN=t", "NODE_RANK=0"};
  e.insert(e.end(), env.begin(), env.end());
  test::Process w(a, e, d.str(name + ".log"));
  const int rc = w.wait(60);
  return {rc, test::slurp(d.str(name + ".log"))};
}
// Starts K servers on free ports; returns the endpoint list once all of them listen.
std::string start_servers(const test::TempDir& d, int k, const std::string& consistency,
                          std::vector<std::unique_ptr<test::Process>>& ps) {
  std::string eps;
  for (int i = 0; i < k; ++i) {
    std::string ep;
    ps.push_back(start_server(d, {"--server.shard=" + std::to_string(i), "--ps.consistency=" + consistency},
                              d.str(fmt::format("server{}.log", i)), &ep));
    eps += (i ? "," : "") + ep;
  }
  return eps;
}
// Node `rank` of an `nnodes`-node parameter-server job (token "t", batch 2) against the servers at
// `eps`, with extra worker flags: writes to d/<name>/, logs to d/<name>.log.
std::unique_ptr<test::Process> start_ps_node(const test::TempDir& d, const std::string& corpus, const std::string& eps,
                                             const std::string& name, int rank, int nnodes,
                                             const std::vector<std::string>& flags) {
  auto a = train_args(d, corpus, d.str(name), 2);
  a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + eps});
  a.insert(a.end(), flags.begin(), flags.end());
  return std::make_unique<test::Process>(
      a, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "NNODES=" + std::to_string(nnodes), "NODE_RANK=" + std::to_string(rank)},
      d.str(name + ".log"));
}
}  // namespace

namespace {
// One ASP worker node on `shards` servers (worker batch `batch`, extra worker args) against one
// process with batch `single_batch` (both with `common` args): the final weights agree within
// rtol/atol. Returns the worker's synchronization counters (its sync.json).
nlohmann::json expect_asp_worker_equals_single(int shards, int batch, int single_batch, const std::vector<std::string>& common,
                                            const std::vector<std::string>& worker, double rtol, double atol) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_servers(d, shards, "asp", servers);
  auto args = train_args(d, corpus, d.str("ps"), batch);
  args.insert(args.end(), {"--dist.mode=ps", "--dist.servers=" + eps, "--dist.timeout_s=20"});
  args.insert(args.end(), common.begin(), common.end());
  args.insert(args.end(), worker.begin(), worker.end());
  test::Process w(args, {"SYNCOPATE_TOKEN=t"}, d.str("ps.log"));
  EXPECT_EQ(w.wait(120), 0) << test::slurp(d.str("ps.log")) << test::slurp(d.str("server0.log"));
  auto single_args = train_args(d, corpus, d.str("single"), single_batch);
  single_args.insert(single_args.end(), common.begin(), common.end());
  test::Process single(single_args, {}, d.str("single.log"));
  EXPECT_EQ(single.wait(120), 0) << test::slurp(d.str("single.log"));
  auto a = weights(d.str("ps")), b = weights(d.str("single"));
  EXPECT_TRUE(torch::allclose(a, b, rtol, atol)) << (a - b).abs().max().item<double>();
  nlohmann::json c = nlohmann::json::parse(test::slurp(d.str("ps/sync.json")));
  GPTConfig shape;  // train_args' model: the flat vector holds the padded vocabulary's rows too
  shape.n_embd = 32, shape.n_head = 2, shape.block_size = 32;
  c["params"] = gpt_num_params(shape);
  return c;
}
}  // namespace

class PsPushModes : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(AfterBackwardOrDuring, PsPushModes, ::testing::Values(false, true));

// With --dist.ps_push_in_backward=true every shard's push leaves from a gradient hook during
// backward (and with grad_accum=2 only during the last micro-batch); the result must not change.
TEST_P(PsPushModes, OneAspWorkerEqualsSingleProcess) {
  const nlohmann::json c = expect_asp_worker_equals_single(
      3, 4, 4, {"--train.grad_accum=2"}, {fmt::format("--dist.ps_push_in_backward={}", GetParam())}, 1e-6, 1e-7);
  // Every shard of every step left from a hook: 6 steps x 3 shards; after backward, none did.
  EXPECT_EQ(c["reduced"], GetParam() ? 18 : 0) << c.dump();
  EXPECT_EQ(c["launched_early"], GetParam() ? 18 : 0) << c.dump();
  // 6 pushes of the whole model in float32, each byte once (no resend).
  EXPECT_EQ(c["wire_bytes"], 6 * c["params"].get<int64_t>() * 4) << c.dump();
  // Received: INIT's reply and 6 replies, the whole model in float32 each.
  EXPECT_EQ(c["wire_bytes_received"], 7 * c["params"].get<int64_t>() * 4) << c.dump();
}

// Issue 29: a switch into ps mode at a checkpoint carries AdamW's state to the shards (protocol 8).
// One process trains 3 steps alone (mode none; a constant learning rate, so that the shorter first
// run's schedule is the longer one's), checkpoints, and resumes as the worker of two ASP shards for
// 3 more: it ends where the same process alone for 6 steps ends, within OneAspWorkerEqualsSingleProcess's
// tolerance.
TEST(PsTraining, ASwitchIntoPsCarriesAdamWsStateToTheShards) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::vector<std::string> flat_lr = {"--optim.lr=0.003", "--schedule.min_lr=0.003", "--schedule.warmup_steps=0"};
  auto run = [&](const std::string& out, std::vector<std::string> extra, const std::string& log) {
    auto a = train_args(d, corpus, d.str(out), 4);
    a.insert(a.end(), flat_lr.begin(), flat_lr.end());
    a.insert(a.end(), extra.begin(), extra.end());
    test::Process p(a, {"SYNCOPATE_TOKEN=t"}, d.str(log));
    EXPECT_EQ(p.wait(120), 0) << test::slurp(d.str(log));
  };
  run("alone", {}, "alone.log");
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_servers(d, 2, "asp", servers);
  run("sw", {"--train.steps=3", "--checkpoint.every=3"}, "sw1.log");
  run("sw", {"--resume", "--dist.mode=ps", "--dist.servers=" + eps, "--dist.timeout_s=20"}, "sw2.log");
  const std::string log = test::slurp(d.str("sw2.log"));
  EXPECT_NE(log.find("switching from none to ps at this checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("AdamW's moments too (to the shards, with their INIT"), std::string::npos) << log;
  auto a = weights(d.str("sw")), b = weights(d.str("alone"));
  // (A shard's AdamW from zero moves each weight by about lr = 3e-3 in its first step, not 1e-6 away:
  // ParameterShard.AnInitWithMomentsStartsAdamWFromThem shows the difference on one shard.)
  EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-7)) << (a - b).abs().max().item<double>();
}

// Issue 12: compressed pushes. bf16 and int8 (with error feedback) gradients reach the shards,
// which decode them; the run stays within the compression's reach of the float32 one, and each
// step's bytes are exactly the format's: 2 per value for bf16, 1 per value plus a 4-byte scale
// per 4096 values of each shard for int8.
TEST(PsTraining, CompressedPushesTrainAndSendTheFormatsBytes) {
  for (const std::string wire : {"bf16", "int8"}) {
    SCOPED_TRACE(wire);
    const nlohmann::json c = expect_asp_worker_equals_single(3, 4, 4, {}, {"--dist.wire=" + wire}, 0.0, 2e-2);
    const int64_t p = c["params"].get<int64_t>();
    int64_t per_step = 0;
    const auto b = Sharding::bounds(p, 3);
    for (int k = 0; k < 3; ++k) per_step += static_cast<int64_t>(wire_bytes(parse_wire_format(wire), b[k + 1] - b[k]));
    EXPECT_EQ(per_step, wire == "bf16" ? 2 * p : p + 4 * ((b[1] - b[0] + 4095) / 4096 + (b[2] - b[1] + 4095) / 4096 + (b[3] - b[2] + 4095) / 4096));
    EXPECT_EQ(c["wire_bytes"], 6 * per_step) << c.dump();
    EXPECT_EQ(c["wire_bytes_received"], 7 * p * 4) << c.dump();  // replies stay float32 whatever the push's format
  }
}

// What a compressed push delivers, seen through a shard that applies it linearly (the local SGD
// "average" rule: w <- w - delta): per element within the format's rounding, and with int8's
// error feedback two pushes together deliver their sum within one rounding step.
TEST(PsClient, CompressedPushesDeliverTheirValuesWithinTheFormatsBound) {
  for (const WireFormat wire : {WireFormat::kBf16, WireFormat::kFp16, WireFormat::kInt8}) {
    SCOPED_TRACE(wire_dtype(wire));
    InProcessServer server(ServerConfig{}, PsConfig{}, "t");
    PsClientOptions o = client_options("t", true);
    o.wire = wire;
    PsClient c({server.endpoint}, "t", 0, 1, o);
    const int64_t n = 10000;
    at::Tensor w = torch::zeros({n});
    c.init(w, {}, AdamWConfig{}, 0, ShardUpdate{"average", 1.0, 0.0});
    torch::manual_seed(3);
    const at::Tensor d1 = torch::randn({n}), d2 = torch::randn({n}) * 1e-3;  // d2: mostly below int8's step
    push_pull(c, d1, w, 0, 0.0);
    const at::Tensor err1 = (-w - d1).abs(), r1 = d1 + w;  // r1: what the first push dropped (w = -sent)
    if (wire == WireFormat::kInt8) EXPECT_LE(err1.max().item<double>(), 0.5 * 1.001 * d1.abs().max().item<double>() / 127);
    else EXPECT_TRUE((err1 <= d1.abs() * std::ldexp(1.0, wire == WireFormat::kBf16 ? -8 : -11)).all().item<bool>());
    push_pull(c, d2, w, 1, 0.0);
    if (wire == WireFormat::kInt8) {
      // Error feedback: the second push carried r1, so the two together miss d1 + d2 only by the
      // second one's rounding (half a step of |d2 + r1|'s scale), far below the first one's loss.
      const double total = (-w - (d1 + d2)).abs().max().item<double>();
      const double bound = 0.5 * 1.001 * (d2 + r1).abs().max().item<double>() / 127;
      EXPECT_LE(total, bound);
      EXPECT_LT(bound * 20, r1.abs().max().item<double>());  // the bound is tight enough to tell
    }
    const auto stats = nlohmann::json::parse(c.stats(0));
    EXPECT_EQ(stats["wire"], wire_dtype(wire)) << stats.dump();
    EXPECT_EQ(stats["version"], 2);
  }
}

// Issue 25: what an evaluation of a parameter-server job scores. PULL returns the shards' current
// values (another worker's update included, every part of a partitioned server), and node 0's
// wait for the job's end returns only once every other worker has finished.
TEST(PsClient, PullTakesTheShardsValuesAndTheJobEndWaitsForTheOtherWorkers) {
  PsConfig pc;
  pc.consistency = "asp";
  InProcessServer server(ServerConfig{}, pc, "t");
  PsClientOptions o = client_options("t", true);
  o.partition_elems = 300;  // 4 parts of the server's range: pull reassembles them
  PsClient a({server.endpoint}, "t", 0, 2, o), b({server.endpoint}, "t", 1, 2, o);
  const int64_t n = 1000;
  at::Tensor wa = torch::zeros({n}), wb = torch::zeros({n});
  a.init(wa, {}, AdamWConfig{}, 0);
  b.init(wb, {}, AdamWConfig{}, 0);
  ASSERT_EQ(a.parts(), 4);
  torch::manual_seed(5);
  push_pull(b, torch::randn({n}), wb, 0, 1e-2);  // b's update: a has not seen it
  ASSERT_FALSE(torch::equal(wa, wb));
  at::Tensor pulled = torch::full({n}, 7.0f);
  a.pull(pulled);
  EXPECT_TRUE(torch::equal(pulled, wb)) << (pulled - wb).abs().max().item<double>();
  at::Tensor again = torch::zeros({n});
  a.pull(again);
  EXPECT_TRUE(torch::equal(again, wb));  // a pull applies nothing: pulled twice, the same values
  // (The wait gives up by itself once shard 0 applied nothing for the client's timeout, 10 s: no hang.)
  auto done = std::async(std::launch::async, [&] { return a.wait_for_other_workers(0.01); });
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);  // b is alive, not finished
  b.finish(1);
  EXPECT_TRUE(done.get()) << "b finished: the wait ends with every other worker done, not by giving up";
}

// server.latency_ms: the delay line holds every message 0.1 s on its way in and 0.1 s on its way out, so
// one push/pull round trip takes at least 0.2 s more; the update it applies is the one a server
// without latency applies (the delay changes when, not what).
TEST(PsServer, EmulatedLatencyHoldsEveryMessageBothWaysAndChangesNoValue) {
  PsConfig pc;
  pc.consistency = "asp";
  ServerConfig slow;
  slow.latency_ms = 100;
  const int64_t n = 1000;
  auto round_trip = [&](const ServerConfig& sc, double* seconds) {
    InProcessServer server(sc, pc, "t");
    PsClientOptions o = client_options("t", true);
    o.partition_elems = 300;  // 4 parts on one connection: they share the delay, as pipelined messages do
    PsClient c({server.endpoint}, "t", 0, 1, o);
    at::Tensor w = torch::zeros({n});
    c.init(w, {}, AdamWConfig{}, 0);
    torch::manual_seed(3);
    at::Tensor g = torch::randn({n});
    const auto t0 = std::chrono::steady_clock::now();
    push_pull(c, g, w, 0, 1e-2);
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return w;
  };
  double fast_s = 0, slow_s = 0;
  at::Tensor plain = round_trip(ServerConfig{}, &fast_s);
  at::Tensor delayed = round_trip(slow, &slow_s);
  EXPECT_TRUE(torch::equal(plain, delayed));
  EXPECT_GE(slow_s, 0.2) << "without latency: " << fast_s << " s";
  EXPECT_LT(slow_s, 0.2 + 4 * 0.2) << "the parts' delays were paid one after another, not together";
}

// The last reply a server sends before it exits (FINISH with server.exit_when_done) is still in the
// delay line when the loop ends: the server lets it leave first, so the worker's FINISH is answered
// (not resent until dist.timeout_s and then failed).
TEST(PsServer, ALastReplyLeavesTheDelayLineBeforeTheServerExits) {
  PsConfig pc;
  pc.consistency = "asp";
  ServerConfig sc;
  sc.latency_ms = 100;
  sc.exit_when_done = true;
  InProcessServer server(sc, pc, "t");
  PsClientOptions o = client_options("t", true);
  o.first_resend_s = 30;  // a lost reply would show as a wait, not be hidden by a resend
  PsClient c({server.endpoint}, "t", 0, 1, o);
  at::Tensor w = torch::zeros({100});
  c.init(w, {}, AdamWConfig{}, 0);
  push_pull(c, torch::ones({100}), w, 0, 1e-2);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(c.finish(1));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// A node of two CPU replicas averages inside the node, and local replica 0 alone pushes and pulls
// for it: one ASP worker node equals one process with the node's whole batch. fp32 tolerance as
// in the ring tests: the mean of two half-batch gradients is not the full-batch gradient bit for
// bit, and AdamW's normalisation magnifies the last bits.
TEST(PsTraining, NodeOfTwoLocalReplicasEqualsSingleProcess) {
  expect_asp_worker_equals_single(2, 2, 4, {}, {"--dist.local_replicas=2", "--dist.check_every=2"}, 1e-4, 1e-5);
}
// The same node pushing during backward: each shard's range is reduced inside the node the moment
// backward has finished it on both replicas, and replica 0 pushes the mean at once (6 steps x 2
// shards, only in the last of 2 micro-batches).
TEST(PsTraining, NodeOfTwoLocalReplicasPushingDuringBackwardEqualsSingleProcess) {
  const nlohmann::json c = expect_asp_worker_equals_single(
      2, 2, 4, {"--train.grad_accum=2"},
      {"--dist.local_replicas=2", "--dist.check_every=2", "--dist.ps_push_in_backward=true"}, 1e-4, 1e-5);
  EXPECT_EQ(c["reduced"], 12) << c.dump();
  EXPECT_EQ(c["launched_early"], 12) << c.dump();
}

TEST_P(PsPushModes, BspOverServersEqualsRing) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_servers(d, 2, "bsp", servers);
  const std::vector<std::string> rendezvous = test::rendezvous_args(d);
  std::vector<std::unique_ptr<test::Process>> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(start_ps_node(d, corpus, eps, fmt::format("ps{}", r), r, 2,
                               {fmt::format("--dist.ps_push_in_backward={}", GetParam())}));
    auto b = train_args(d, corpus, d.str(fmt::format("ring{}", r)), 2);
    b.push_back("--dist.mode=ring");
    b.insert(b.end(), rendezvous.begin(), rendezvous.end());
    ps.push_back(std::make_unique<test::Process>(
        b, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "NNODES=2", "NODE_RANK=" + std::to_string(r)},
        d.str(fmt::format("ring{}.log", r))));
  }
  for (auto& p : ps) ASSERT_EQ(p->wait(120), 0) << test::slurp(d.str("ps0.log")) << test::slurp(d.str("ring0.log"));
  auto a = weights(d.str("ps0")), b = weights(d.str("ring0"));
  EXPECT_TRUE(torch::equal(a, weights(d.str("ps1"))));  // BSP workers end identical
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6)) << (a - b).abs().max().item<double>();
}

// Issue 12: pipelined partitions. Two BSP workers on two servers whose ranges travel in partitions
// of 0.01 MiB (2621 values, 8 per server), pushed after backward or from the gradient hooks
// during it, end where the same job with whole shards ends; every server holds its partitions.
TEST_P(PsPushModes, PartitionedBspEqualsWholeShards) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string whole_eps = start_servers(d, 2, "bsp", servers), part_eps = start_servers(d, 2, "bsp", servers);
  std::vector<std::unique_ptr<test::Process>> ps;
  for (const std::string kind : {"whole", "part"})
    for (int r = 0; r < 2; ++r) {
      ps.push_back(start_ps_node(d, corpus, kind == "part" ? part_eps : whole_eps, fmt::format("{}{}", kind, r), r, 2,
                                 {fmt::format("--dist.ps_push_in_backward={}", GetParam()),
                                  fmt::format("--dist.ps_partition_mb={}", kind == "part" ? 0.01 : 0.0)}));
    }
  for (auto& p : ps) ASSERT_EQ(p->wait(120), 0) << test::slurp(d.str("part0.log")) << test::slurp(d.str("whole0.log"));
  const at::Tensor whole = weights(d.str("whole0")), part = weights(d.str("part0"));
  EXPECT_TRUE(torch::equal(part, weights(d.str("part1"))));  // BSP workers end identical
  EXPECT_TRUE(torch::equal(part, whole)) << (part - whole).abs().max().item<double>();  // element-wise rules
  PsClient c(PsClient::parse_endpoints(part_eps), "t", 0, 2, client_options("t", true));
  int partitions = 0;
  for (int k = 0; k < 2; ++k) {
    const auto stats = nlohmann::json::parse(c.stats(k));
    partitions += stats["partitions"].get<int>();
    EXPECT_GE(stats["partitions"].get<int>(), 5) << stats.dump();
    EXPECT_EQ(stats["version"], 6) << stats.dump();  // every partition took every step once
    EXPECT_EQ(stats["updates"], 6 * stats["partitions"].get<int>()) << stats.dump();  // summed over partitions
  }
  const nlohmann::json sync = nlohmann::json::parse(test::slurp(d.str("part0/sync.json")));
  EXPECT_EQ(sync["launched_early"], GetParam() ? 6 * partitions : 0) << sync.dump();  // during backward: every part
}

// Issue 15 (2): with clipping on, BSP clips each node's gradient before the servers average them;
// a ring with dist.clip_scope=node does the same and ends at the same weights, while the ring's
// default (clip the job's mean, as DDP) ends elsewhere: the setting is what the A/B must match.
TEST(PsTraining, BspEqualsRingWithClippingOnWhenBothClipPerNode) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_servers(d, 2, "bsp", servers);
  auto args = [&](const std::string& out, std::vector<std::string> extra) {
    auto a = train_args(d, corpus, d.str(out), 2);
    std::replace(a.begin(), a.end(), std::string("--optim.grad_clip=0"), std::string("--optim.grad_clip=0.05"));
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::vector<std::unique_ptr<test::Process>> ps;
  std::vector<std::string> node_ring = test::rendezvous_args(d), job_ring = test::rendezvous_args(d);
  node_ring.insert(node_ring.end(), {"--dist.mode=ring", "--dist.clip_scope=node"});
  job_ring.push_back("--dist.mode=ring");
  for (int r = 0; r < 2; ++r) {
    const std::vector<std::string> env{"SYNCOPATE_TOKEN=t", "NNODES=2", "NODE_RANK=" + std::to_string(r)};
    ps.push_back(std::make_unique<test::Process>(args(fmt::format("ps{}", r), {"--dist.mode=ps", "--dist.servers=" + eps}),
                                                 env, d.str(fmt::format("ps{}.log", r))));
    ps.push_back(std::make_unique<test::Process>(args(fmt::format("node{}", r), node_ring), env, d.str(fmt::format("node{}.log", r))));
    ps.push_back(std::make_unique<test::Process>(args(fmt::format("job{}", r), job_ring), env, d.str(fmt::format("job{}.log", r))));
  }
  for (auto& p : ps) ASSERT_EQ(p->wait(120), 0) << test::slurp(d.str("ps0.log")) << test::slurp(d.str("node0.log"));
  const at::Tensor bsp = weights(d.str("ps0")), node = weights(d.str("node0")), job = weights(d.str("job0"));
  EXPECT_TRUE(torch::equal(node, weights(d.str("node1"))));
  EXPECT_TRUE(torch::allclose(bsp, node, 1e-5, 1e-6)) << (bsp - node).abs().max().item<double>();
  EXPECT_GT((bsp - job).abs().max().item<double>(), 1e-4) << "clipping was not active: lower the bound";
}

TEST(ParameterShard, BspDropsASilentWorkerAndTakesItBackWhenItSpeaks) {
  PsConfig c;
  c.consistency = "bsp";
  c.worker_timeout_s = 5;
  ParameterShard s(c);
  std::vector<float> init(2, 0.0f), g(2, 1.0f);
  s.init(init_header(3, 2), init.data(), nullptr, 0);
  for (int w = 0; w < 3; ++w) s.seen(w, 0.0);
  EXPECT_TRUE(s.push(push_header(0, 0, 0, 2), g.data()).empty());
  EXPECT_TRUE(s.push(push_header(1, 0, 0, 2), g.data()).empty());  // worker 2 is silent
  EXPECT_TRUE(s.expire(4.0).empty());                                // not yet past the timeout
  EXPECT_EQ(s.expire(6.0), (std::vector<int>{0, 1}));                // worker 2 declared dead: round completes
  EXPECT_EQ(s.live_workers(), 2);
  EXPECT_EQ(s.version(), 1);
  s.seen(2, 7.0);  // it comes back
  EXPECT_EQ(s.live_workers(), 3);
  EXPECT_TRUE(s.push(push_header(0, 1, 1, 2), g.data()).empty());   // rounds wait for it again
}

TEST(PsTraining, KilledBspWorkerDoesNotHangTheOthers) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--ps.consistency=bsp", "--ps.worker_timeout_s=5"}, d.str("server.log"), &ep);
  std::vector<std::unique_ptr<test::Process>> ws;
  for (int r = 0; r < 2; ++r)
    ws.push_back(start_ps_node(d, corpus, ep, fmt::format("w{}", r), r, 2, {"--train.steps=300", "--dist.timeout_s=30"}));
  ASSERT_TRUE(test::wait_for_step(d.str("w1"), 3, 120)) << test::slurp(d.str("w1.log"));  // under way
  ws[1]->kill_hard();
  EXPECT_EQ(ws[0]->wait(90), 0) << test::slurp(d.str("w0.log")) << test::slurp(d.str("server.log"));
}

// Issue 25, found by the demo's review: under ASP with a straggler node 0 stops stepping long
// before the job ends. While it waits for the others (job_final), the evaluation points the
// shards' count of the job's tokens passes are taken from the servers (while_waiting records),
// so the curve has no gap; and a node's deferred evaluations are scored after its FINISH, so
// node 0's final record is stamped when the straggler's last update landed, not after its scoring.
TEST(PsTraining, NodeZeroEvaluatesTheServersWhileItWaitsForAStraggler) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--ps.consistency=asp"}, d.str("server.log"), &ep);
  std::vector<std::unique_ptr<test::Process>> ws;
  for (int r = 0; r < 2; ++r)  // 64 tokens per node step
    ws.push_back(start_ps_node(d, corpus, ep, fmt::format("w{}", r), r, 2,
                               {"--train.steps=8", "--eval.every_tokens=128", "--eval.defer=true",
                                "--eval.val_windows=300", "--emulate.step_time_s=0.05",
                                fmt::format("--emulate.slowdown={}", r == 1 ? 8 : 1)}));
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ws[static_cast<size_t>(r)]->wait(120), 0) << test::slurp(d.str(fmt::format("w{}.log", r)));
  std::vector<nlohmann::json> evals, waiting, slow_steps;
  for (auto& m : test::read_jsonl(d.str("w0/metrics.jsonl")))
    if (m.contains("val_loss")) evals.push_back(m);
  for (auto& m : test::read_jsonl(d.str("w1/metrics.jsonl")))
    if (m.contains("tokens_per_s")) slow_steps.push_back(m);
  for (auto& m : evals)
    if (m.value("while_waiting", false)) waiting.push_back(m);
  ASSERT_FALSE(evals.empty());
  const auto& fin = evals.back();
  EXPECT_TRUE(fin.value("job_final", false)) << fin.dump();
  EXPECT_EQ(fin["global_tokens"], 16 * 64) << fin.dump();  // both nodes' 8 pushes
  // The straggler's 8 steps of 0.4 s: node 0 (0.05 s steps) waited most of that; 4 or more points of
  // 128 global tokens lie in its wait.
  ASSERT_GE(waiting.size(), 3u) << test::slurp(d.str("w0/metrics.jsonl"));
  int64_t before = 0;
  for (const auto& m : waiting) {
    EXPECT_EQ(m["eval_of"], "servers");
    EXPECT_EQ(m["step"], 8);
    const int64_t g = m["global_tokens"].get<int64_t>();
    EXPECT_GT(g / 128, before / 128) << "two points in one interval of eval.every_tokens: " << m.dump();
    before = g;
  }
  // (the last may be at the job's total: the straggler's last push landed, its FINISH not yet)
  EXPECT_LE(before, 16 * 64);
  // Stamped on the training clock: the final point is the straggler's end (within start-up skew and
  // the last round trip), not after its scoring of 8 deferred snapshots.
  EXPECT_LT(std::abs(fin["time_s"].get<double>() - slow_steps.back()["time_s"].get<double>()), 2.0)
      << fin.dump() << " vs the straggler's last step " << slow_steps.back().dump();
  // The straggler scores its 8 deferred snapshots (300 windows each) after its FINISH: node 0's
  // final weights exist before the straggler's last metrics line is written. (Scored before
  // FINISH, as before the fix, node 0 waited for that scoring: its stamp came after.)
  struct stat st {};
  ASSERT_EQ(::stat(d.str("w1/metrics.jsonl").c_str(), &st), 0);
  const double slow_written = static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
  EXPECT_LT(fin["unix_s"].get<double>(), slow_written)
      << "node 0's final weights were stamped after the straggler had scored its snapshots";
}

// Issue 29 (the switch study): under BSP with a backup worker a node 8x slower than the others is
// behind the servers' rounds all along (every push of its is dropped as late). Before protocol 9 it
// ran all its steps after the others had finished, each push then applied alone (more updates than
// the job's steps, and the job's end the slow node's). Now the replies say where the rounds stand:
// it ends when they reach train.steps, and the shards applied exactly the job's 12 rounds.
TEST(PsTraining, ANodeBehindTheBspRoundsEndsWhenTheyReachTheBudget) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--ps.consistency=bsp", "--ps.backup_workers=1"}, d.str("server.log"), &ep);
  std::vector<std::unique_ptr<test::Process>> ws;
  for (int r = 0; r < 3; ++r)
    ws.push_back(start_ps_node(d, corpus, ep, fmt::format("w{}", r), r, 3,
                               {"--train.steps=12", "--emulate.step_time_s=0.05",
                                fmt::format("--emulate.slowdown={}", r == 2 ? 8 : 1)}));
  for (int r = 0; r < 3; ++r) ASSERT_EQ(ws[static_cast<size_t>(r)]->wait(120), 0) << test::slurp(d.str(fmt::format("w{}.log", r)));
  int64_t slow_last = 0;
  for (auto& m : test::read_jsonl(d.str("w2/metrics.jsonl")))
    if (m.contains("tokens_per_s")) slow_last = m["step"].get<int64_t>();
  // 12 steps of 0.05 s for the others, of 0.4 s for it: the rounds reach 12 during its second or third step.
  EXPECT_GE(slow_last, 1);
  EXPECT_LE(slow_last, 6) << test::slurp(d.str("w2.log"));
  EXPECT_NE(test::slurp(d.str("w2.log")).find("node 2 ends after its step " + std::to_string(slow_last) + " of 12: "
                                              "the servers' rounds reached the job's 12 steps"),
            std::string::npos)
      << test::slurp(d.str("w2.log"));
  ASSERT_TRUE(std::filesystem::exists(d.str(fmt::format("w2/checkpoints/step_{:06d}", slow_last))))
      << "its state at its end is checkpointed like a run's last step";
  PsClient c({ep}, "t", 0, 3, client_options("t", true));
  const auto stats = nlohmann::json::parse(c.stats(0));
  EXPECT_EQ(stats["updates"], 12) << stats.dump();  // the job's rounds, none applied after them
  // Node 0's final weights exist once the slow node has ended: well before its 12 steps of 0.4 s.
  nlohmann::json fin;
  for (auto& m : test::read_jsonl(d.str("w0/metrics.jsonl")))
    if (m.value("job_final", false)) fin = m;
  ASSERT_FALSE(fin.is_null()) << test::slurp(d.str("w0/metrics.jsonl"));
  EXPECT_LT(fin["time_s"].get<double>(), 12 * 0.4) << fin.dump();
}

// Plain TCP: the garbage reaches the dispatcher, which answers each with an ERROR. Encrypted (the
// default with a token): it never gets past the CURVE handshake, so the dispatcher sees none.
class PsGarbage : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(PlainOrEncrypted, PsGarbage, ::testing::Values("off", "auto"));
TEST_P(PsGarbage, GarbageSentToALiveServerDuringTrainingDoesNotStopIt) {
  const std::string encrypt = GetParam();
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--server.encrypt=" + encrypt}, d.str("server.log"), &ep);
  auto a = train_args(d, corpus, d.str("w"), 2);
  a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + ep, "--train.steps=60", "--dist.ps_encrypt=" + encrypt});
  test::Process w(a, {"SYNCOPATE_TOKEN=t"}, d.str("w.log"));
  std::mt19937 rng(3);
  int sent = 0;
  {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(ep);
    while (w.wait(0) == -1 && sent < 2000) {  // bounded: at most 2000 hostile messages
      std::string junk(rng() % 64 + 1, '\0');
      for (auto& ch : junk) ch = static_cast<char>(rng());
      s.send(zmq::buffer(junk), zmq::send_flags::dontwait);
      ++sent;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  EXPECT_EQ(w.wait(60), 0) << test::slurp(d.str("w.log"));
  EXPECT_GT(sent, 10);
  PsClient c({ep}, "t", 0, 1, client_options("t", encrypt == "auto"));
  auto stats = nlohmann::json::parse(c.stats(0));
  if (encrypt == "off") EXPECT_GE(stats["bad_messages"].get<int>(), 10) << stats.dump();
  else EXPECT_EQ(stats["bad_messages"].get<int>(), 0) << stats.dump();
  EXPECT_EQ(stats["version"], 60);
}

// Parameter: dist.ps_partition_mb. Partitioned (0.02 MiB: 5242 values, 8 partitions), each
// partition has its own checkpoint file and is resumed from it.
class PsServerRestart : public ::testing::TestWithParam<double> {};
INSTANTIATE_TEST_SUITE_P(WholeOrPartitioned, PsServerRestart, ::testing::Values(0.0, 0.02));

TEST_P(PsServerRestart, KilledAndRestartedServerResumesFromItsCheckpoint) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::vector<std::string> server_args = {"--server.checkpoint_dir=" + d.str("ckpt"), "--server.checkpoint_every=5"};
  std::string ep;
  auto server = start_server(d, server_args, d.str("server1.log"), &ep);
  auto a = train_args(d, corpus, d.str("w"), 2);
  a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + ep, "--train.steps=400", "--dist.timeout_s=60",
                     fmt::format("--dist.ps_partition_mb={}", GetParam())});
  test::Process w(a, {"SYNCOPATE_TOKEN=t"}, d.str("w.log"));
  // Past two shard checkpoints (every 5 updates) and into the next interval: a readiness wait on
  // the worker's own progress, not a sleep.
  ASSERT_TRUE(test::wait_for_step(d.str("w"), 13, 60)) << test::slurp(d.str("w.log"));
  ASSERT_TRUE(std::filesystem::exists(d.str(GetParam() > 0 ? "ckpt/shard_0.at0.safetensors" : "ckpt/shard_0.safetensors")));
  server->kill_hard();  // the server dies mid-training...
  server->wait(10);
  // ...and comes back on the same port (the workers know that endpoint).
  std::vector<std::string> again = {kBin + "/syncopate-server", "--server.port=" + ep.substr(ep.rfind(':') + 1)};
  again.insert(again.end(), server_args.begin(), server_args.end());
  server = std::make_unique<test::Process>(again, std::vector<std::string>{"SYNCOPATE_TOKEN=t"}, d.str("server2.log"));
  ASSERT_EQ(w.wait(120), 0) << test::slurp(d.str("w.log")) << test::slurp(d.str("server2.log"));  // ...training finishes
  EXPECT_NE(test::slurp(d.str("server2.log")).find("resumed from"), std::string::npos) << test::slurp(d.str("server2.log"));
  PsClient c({ep}, "t", 0, 1, client_options("t", true));
  auto stats = nlohmann::json::parse(c.stats(0));
  // Every step after the checkpoint is applied exactly once more; none twice. What the kill lost
  // are the updates after the last checkpoint (one every 5): at most 4, plus the push in flight.
  // Partitioned: `version` is the lowest partition's, `updates` the sum over all of them. (A resend
  // of a push some partition had applied and checkpointed before the kill is a counted duplicate.)
  const int partitions = stats["partitions"].get<int>();
  EXPECT_EQ(partitions, GetParam() > 0 ? 8 : 1) << stats.dump();
  EXPECT_LE(stats["updates"].get<int>(), 400 * partitions) << stats.dump();
  EXPECT_GE(stats["version"].get<int>(), 395) << stats.dump();
}

// Also with a node of two local replicas: replica 0 overlaps the round trip for the node, and the
// other replica takes the node's weights after every apply and synchronize (check_every=5 would
// fail the run if the two ever differed).
TEST(PsTraining, OverlappedPushPullAddsOneStepOfStaleness) {
  for (int local : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} local replica(s)", local));
    test::TempDir d;
    const std::string corpus = test::write_tiny_corpus(d);
    std::vector<std::unique_ptr<test::Process>> servers;
    const std::string eps = start_servers(d, 2, "asp", servers);
    auto a = train_args(d, corpus, d.str("w"), 2);
    a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + eps, "--dist.ps_overlap=true", "--train.steps=20",
                       "--checkpoint.every=0", "--eval.every=0", "--dist.check_every=5",
                       fmt::format("--dist.local_replicas={}", local)});
    test::Process w(a, {"SYNCOPATE_TOKEN=t"}, d.str("w.log"));
    ASSERT_EQ(w.wait(120), 0) << test::slurp(d.str("w.log"));
    std::ifstream f(d.str("w/metrics.jsonl"));
    std::string line;
    std::vector<double> stale;
    while (std::getline(f, line)) {
      auto m = nlohmann::json::parse(line);
      if (m.contains("staleness")) stale.push_back(m["staleness"]);
    }
    ASSERT_EQ(stale.size(), 20u);
    // One worker, gradients computed one round trip behind: every update after the first has
    // staleness exactly 1 (each step reports the previous round trip's).
    for (size_t i = 2; i < stale.size(); ++i) EXPECT_EQ(stale[i], 1.0) << "step " << i + 1;
  }
}

TEST(PsServer, CurveEncryptionAdmitsOnlyClientsWithTheServerKey) {
  test::TempDir d;
  auto gen = test::run_command(kBin + "/syncopate-server --generate-curve-keys");
  ASSERT_EQ(gen.exit_code, 0) << gen.output;
  std::ofstream(d.str("keys")) << gen.output;
  const std::string server_public = gen.output.substr(0, 40);
  ServerConfig sc;
  sc.curve_key_file = d.str("keys");
  InProcessServer server(sc, PsConfig{}, "job", server_public);
  const std::string endpoint = server.endpoint;
  {  // no CURVE: the handshake fails, nothing is ever answered
    PsClient plain({endpoint}, "job", 0, 1, PsClientOptions{/*timeout_s=*/1.0});
    auto p = torch::ones({4});
    EXPECT_THROW(plain.init(p, {}, AdamWConfig{}), Error);
  }
  char wrong_pub[41], wrong_sec[41];
  zmq_curve_keypair(wrong_pub, wrong_sec);
  {  // the wrong server key: same. Again and again on one client: once a failed handshake has left
     // the DEALER without a connection, a send blocked forever before sends had a timeout (seen
     // once in ten suite runs on a loaded machine); every attempt must now fail within its bound.
    PsClient wrong({endpoint}, "job", 0, 1, PsClientOptions{0.5, 5, wrong_pub});
    auto p = torch::ones({4});
    for (int attempt = 0; attempt < 8; ++attempt) {
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_THROW(wrong.init(p, {}, AdamWConfig{}), Error);
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0) << attempt;
    }
  }
  PsClient good({endpoint}, "job", 0, 1, PsClientOptions{10, 5, server_public});
  auto p = torch::ones({4});
  good.init(p, {}, AdamWConfig{});
  auto g = torch::ones({4});
  push_pull(good, g, p, 0, 0.1);
  EXPECT_LT(p[0].item<float>(), 1.0f);
}

// The client's push is zero-copy and the message holds a reference to the gradient; a resend is a
// copy. Here a server (a bare ROUTER) stays silent long enough for the client to resend a 64 MB
// push, then answers the first copy while the resend is still queued in the client's ZeroMQ
// (64 MB is far more than the socket buffers hold). The caller then writes the next step's
// gradient into the same memory, as the training loop does. The resend the server reads must
// carry the gradient it was made for: with a zero-copy resend it would carry the next step's.
TEST(PsClient, ResendQueuedWhileTheNextStepWritesCarriesItsOwnGradient) {
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::rcvtimeo, 20000);  // a broken client fails the test instead of hanging it
  router.set(zmq::sockopt::rcvhwm, 1);         // no read-ahead: unread resends stay in the client
  router.set(zmq::sockopt::rcvbuf, 1 << 16);
  router.bind("tcp://127.0.0.1:*");
  const std::string ep = router.get(zmq::sockopt::last_endpoint);
  const int64_t n = int64_t{16} << 20;  // float32 elements: 64 MB
  std::atomic<bool> overwritten{false};
  float resend_min = 1e9, resend_max = -1e9;
  int resends_read = 0;
  std::thread server([&] {
    auto reply = [&](zmq::message_t& id, int64_t clock) {
      MsgHeader r;
      r.type = static_cast<int>(MsgType::kOk);
      r.clock = clock;
      r.offset = 0;
      r.length = n;
      router.send(id, zmq::send_flags::sndmore);
      router.send(zmq::buffer(encode_header(r)), zmq::send_flags::sndmore);
      std::vector<float> values(static_cast<size_t>(n), 0.5f);
      router.send(zmq::buffer(values), zmq::send_flags::none);
    };
    std::vector<zmq::message_t> init, push, resend;
    while (init.empty() || decode_header(init[1].data(), init[1].size()).type != static_cast<int>(MsgType::kInit)) {
      init.clear();
      if (!zmq::recv_multipart(router, std::back_inserter(init))) return;  // heartbeats come too
    }
    reply(init[0], 0);
    while (push.empty() || decode_header(push[1].data(), push[1].size()).type != static_cast<int>(MsgType::kPushPull)) {
      push.clear();
      if (!zmq::recv_multipart(router, std::back_inserter(push))) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // silent: the client resends at 0.3 s and 0.9 s
    reply(push[0], decode_header(push[1].data(), push[1].size()).clock);
    while (!overwritten) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    router.set(zmq::sockopt::rcvtimeo, 500);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < until) {  // every copy still on its way (heartbeats aside)
      resend.clear();
      if (!zmq::recv_multipart(router, std::back_inserter(resend))) continue;
      if (decode_header(resend[1].data(), resend[1].size()).type != static_cast<int>(MsgType::kPushPull)) continue;
      ++resends_read;
      const float* v = static_cast<const float*>(resend[2].data());
      const auto [lo, hi] = std::minmax_element(v, v + resend[2].size() / 4);
      resend_min = std::min(resend_min, *lo), resend_max = std::max(resend_max, *hi);
    }
  });
  PsClientOptions o;
  o.timeout_s = 30;
  o.first_resend_s = 0.3;
  try {
    PsClient c({ep}, "t", 0, 1, o);
    at::Tensor params = at::zeros({n});
    c.init(params, {}, AdamWConfig{});
    at::Tensor grad = at::full({n}, 1.0f);
    const PsTicket t = c.push(0, grad, /*clock=*/0, 0.1);
    const PsReply r = c.wait(t, params);
    EXPECT_EQ(r.version, 0);
    EXPECT_EQ(params[n - 1].item<float>(), 0.5f);
    EXPECT_GE(c.counters().resends, 2);
    grad.fill_(2.0f);  // the next step's gradient, in the same memory
    overwritten = true;
    server.join();
  } catch (...) {
    overwritten = true;
    if (server.joinable()) server.join();
    throw;
  }
  EXPECT_GE(resends_read, 1);
  EXPECT_EQ(resend_min, 1.0f);
  EXPECT_EQ(resend_max, 1.0f);
}

// Issue 11: hostile and faulty inputs never poison the shard.
namespace {
// A shard's whole observable state, to check that a refused message changed nothing.
std::string shard_state(const ParameterShard& s) {
  if (!s.initialized()) return "uninitialized";
  auto j = nlohmann::json::parse(s.stats_json(0));
  j.erase("rejected");
  return j.dump() + fmt::format(" sum={}", s.params().sum().item<double>());
}
}  // namespace

TEST(ParameterShard, NonFiniteOrOversizedGradientsAreRefusedAndChangeNothing) {
  PsConfig c;
  c.max_grad_norm = 100;
  ParameterShard s(c);
  std::vector<float> init(1000, 1.0f), g(1000, 0.5f);
  s.init(init_header(1, 1000), init.data(), nullptr, 0);
  s.push(push_header(0, 0, 0, 1000), g.data());
  const std::string before = shard_state(s);
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> one(g);
    one[17] = bad;
    EXPECT_THROW(s.push(push_header(0, 1, 1, 1000), one.data()), Error);
    std::vector<float> all(1000, bad);
    EXPECT_THROW(s.push(push_header(0, 1, 1, 1000), all.data()), Error);
  }
  std::vector<float> big(1000, 10.0f);  // norm 316 > 100
  EXPECT_THROW(s.push(push_header(0, 1, 1, 1000), big.data()), Error);
  EXPECT_EQ(shard_state(s), before);
  EXPECT_EQ(s.rejected(), 7);
  EXPECT_TRUE(at::isfinite(s.params()).all().item<bool>());
  // The worker's next finite push is its clock 1, not a duplicate: refused pushes took no clock.
  EXPECT_EQ(s.push(push_header(0, 1, 1, 1000), g.data()), std::vector<int>{0});
  EXPECT_EQ(s.version(), 2);
}

TEST(FlatAdamW, StaysFiniteForFiniteGradientsOfAnyMagnitude) {
  AdamWConfig c;
  c.weight_decay = 0.1;
  FlatAdamW opt(c, 4, {{0, 4}}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor p = at::ones({4});
  for (float g : {3.4e38f, -3.4e38f, 3.4e38f, 1.0f, -3.4e38f}) {
    at::Tensor grad = at::full({4}, g);
    opt.step(p, grad, 0.01);
    EXPECT_TRUE(at::isfinite(p).all().item<bool>()) << p;
    EXPECT_TRUE(at::isfinite(opt.exp_avg()).all().item<bool>()) << opt.exp_avg();
  }
}

TEST(ParameterShard, ARefusedFirstInitLeavesTheShardUninitialized) {
  ParameterShard s{PsConfig{}};
  std::vector<float> v(3, 1.0f);
  auto refused = [&](const std::function<void(MsgHeader&)>& spoil, const float* values = nullptr) {
    MsgHeader h = init_header(2, 3);
    h.worker = 0;
    h.offset = 7;
    spoil(h);
    EXPECT_THROW(s.init(h, values ? values : v.data(), nullptr, 0), Error);
    EXPECT_FALSE(s.initialized());
  };
  refused([](MsgHeader& h) { h.worker = -1; });
  refused([](MsgHeader& h) { h.worker = 2; });  // worker >= workers
  refused([](MsgHeader& h) { h.offset = -1; });
  refused([](MsgHeader& h) { h.length = -3; });
  refused([](MsgHeader& h) { h.dtype = "f16"; });
  refused([](MsgHeader& h) { h.lr = std::nan(""); });
  refused([](MsgHeader& h) { h.clock = -1; });
  refused([](MsgHeader& h) { h.param_version = -1; });
  refused([](MsgHeader& h) { h.beta1 = std::nan(""); });
  refused([](MsgHeader& h) { h.beta2 = INFINITY; });
  refused([](MsgHeader& h) { h.beta1 = 1.0; });
  refused([](MsgHeader& h) { h.eps = std::nan(""); });
  refused([](MsgHeader& h) { h.eps = 0; });
  refused([](MsgHeader& h) { h.weight_decay = INFINITY; });
  refused([](MsgHeader& h) { h.weight_decay = -0.1; });
  std::vector<float> nan_values = {1.0f, std::nanf(""), 1.0f};
  refused([](MsgHeader&) {}, nan_values.data());
  // The real workers' INIT still defines the shard.
  MsgHeader h = init_header(2, 3);
  h.worker = 1;
  s.init(h, v.data(), nullptr, 0);
  EXPECT_TRUE(s.initialized());
  EXPECT_EQ(s.offset(), 0);
  EXPECT_EQ(s.length(), 3);
}

// A live server: INIT of length 0 and a single-frame PUSH_PULL used to abort the process (the
// dispatch read a data frame that was not there); every malformed request gets an ERROR and the
// server keeps serving.
TEST(PsServer, EmptyRangesAndMissingFramesGetRepliesNotACrash) {
  ServerConfig sc;
  sc.encrypt = "off";  // a plain DEALER speaks to the dispatcher directly
  InProcessServer server(sc, PsConfig{}, "t");
  const std::string endpoint = server.endpoint;
  {
    zmq::context_t ctx;
    zmq::socket_t s = server.dealer(ctx);
    auto ask = [&](const MsgHeader& h, const std::string* data = nullptr) {
      s.send(zmq::buffer(encode_header(h)), data ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (data) s.send(zmq::buffer(*data), zmq::send_flags::none);
      std::vector<zmq::message_t> parts;
      EXPECT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)));
      return parts.empty() ? MsgHeader{} : decode_header(parts[0].data(), parts[0].size());
    };
    MsgHeader init = init_header(1, 0);
    init.worker = 0;
    init.token = token_digest("t");
    EXPECT_EQ(ask(init).type, static_cast<int>(MsgType::kOk));
    MsgHeader push = push_header(0, 1, 0, 0);
    push.token = init.token;
    EXPECT_EQ(ask(push).type, static_cast<int>(MsgType::kOk));  // an empty range: an empty update, no crash
    push.length = 4;  // a length without its data frame
    push.clock = 2;
    EXPECT_EQ(ask(push).type, static_cast<int>(MsgType::kError));
    MsgHeader neg = init;
    neg.length = -(int64_t{1} << 62);  // a size that overflows when multiplied by 4
    EXPECT_EQ(ask(neg).type, static_cast<int>(MsgType::kError));
    MsgHeader fin;
    fin.type = static_cast<int>(MsgType::kFinish);
    fin.worker = 0;
    fin.token = init.token;
    fin.data = 5;  // neither finished (-1) nor still reading (1)
    const MsgHeader refused = ask(fin);
    EXPECT_EQ(refused.type, static_cast<int>(MsgType::kError));
    EXPECT_NE(refused.text.find("FINISH with data 5"), std::string::npos) << refused.text;
    // Protocol 8: an INIT that says it carries moments but whose data frame holds the values alone.
    MsgHeader short_moments = init_header(1, 2, 100);
    short_moments.worker = 0;
    short_moments.token = init.token;
    short_moments.moments = true;
    const std::string two_values(8, '\0');
    const MsgHeader no_moments = ask(short_moments, &two_values);
    EXPECT_EQ(no_moments.type, static_cast<int>(MsgType::kError));
    EXPECT_NE(no_moments.text.find("INIT data of 8 bytes for 2 values and their AdamW moments"), std::string::npos)
        << no_moments.text;
  }
  PsClient c({endpoint}, "t", 0, 1, PsClientOptions{10});
  auto stats = nlohmann::json::parse(c.stats(0));
  EXPECT_EQ(stats["bad_messages"], 4) << stats.dump();
  EXPECT_EQ(stats["finished"], nlohmann::json::array({false})) << "a refused FINISH changes nothing";
}

// Issue 11: with a job token, the parameter-server link is CURVE-encrypted with keys derived from
// it (no key file): a client of the same job gets in; a client of another job, or one speaking
// plain TCP, never completes the handshake, and nothing of theirs reaches the server.
// Issue 30: such a client is refused by name within a few reconnects (the handshake's failures),
// not after dist.timeout_s of silence: here 30 s, and the refusal must come within 10.
TEST(PsServer, TokenDerivedEncryptionAdmitsOnlyTheJobsClients) {
  InProcessServer server(ServerConfig{}, PsConfig{}, "job-secret");
  const std::string endpoint = server.endpoint;
  auto params = torch::ones({10});
  auto refused_by_name = [&](const std::string& token, bool encrypted, const char* what) {
    PsClientOptions o = client_options(token, encrypted);
    o.timeout_s = 30;
    PsClient c({endpoint}, token, 0, 1, o);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.init(params, {}, AdamWConfig{});
      ADD_FAILURE() << what << ": admitted";
    } catch (const Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 10) << what << ": refused only after " << s << " s: " << e.what();
      EXPECT_NE(std::string(e.what()).find("not a server of this job"), std::string::npos) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("SYNCOPATE_TOKEN"), std::string::npos) << what << ": " << e.what();
    }
  };
  refused_by_name("job-secret", false, "a plain client");
  refused_by_name("other-job", true, "another job's client");
  PsClient good({endpoint}, "job-secret", 0, 1, client_options("job-secret", true));
  good.init(params, {}, AdamWConfig{});
  auto grads = torch::ones({10});
  push_pull(good, grads, params, 0, 0.1);
  auto stats = nlohmann::json::parse(good.stats(0));
  EXPECT_EQ(stats["version"], 1);
  EXPECT_EQ(stats["bad_messages"], 0);  // nothing of the refused clients reached the dispatcher
}

// A TCP listener on loopback that accepts every connection and closes it at once, as a proxy in
// front of a server that is down does (helper-14's case): no ZMTP greeting ever comes from it.
class ClosingListener {
 public:
  ClosingListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) > 0) {
          const int c = ::accept(fd_, nullptr, nullptr);
          if (c >= 0) ::close(c);
        }
      }
    });
  }
  ~ClosingListener() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint;

 private:
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Issue 30: the ZMTP greeting says what a live ZeroMQ server speaks, and nothing where none answers.
TEST(ZmtpGreeting, NamesALiveServersMechanismAndNothingElse) {
  InProcessServer encrypted(ServerConfig{}, PsConfig{}, "job-secret");
  EXPECT_EQ(zmtp_mechanism(encrypted.endpoint, 2.0).value_or("none"), "CURVE");
  ServerConfig off;
  off.encrypt = "off";
  InProcessServer plain(off, PsConfig{}, "job-secret");
  EXPECT_EQ(zmtp_mechanism(plain.endpoint, 2.0).value_or("none"), "NULL");
  ClosingListener closing;
  EXPECT_FALSE(zmtp_mechanism(closing.endpoint, 1.0).has_value());
  EXPECT_FALSE(zmtp_mechanism("tcp://127.0.0.1:1", 1.0).has_value()) << "nothing listens on port 1";
  EXPECT_FALSE(zmtp_mechanism("not-an-endpoint", 1.0).has_value());
}

// Issue 30 (helper-14): connections that are accepted and dropped, as by a proxy in front of a
// server that is down, are not taken for another job's server: the client waits its dist.timeout_s
// and then says the server did not answer, as for any server that is down.
TEST(PsServer, AProxyThatDropsEveryConnectionIsWaitedForNotRefused) {
  ClosingListener proxy;
  PsClientOptions o = client_options("job-secret", true);
  o.timeout_s = 3;
  o.first_resend_s = 1;
  PsClient c({proxy.endpoint}, "job-secret", 0, 1, o);
  auto params = torch::ones({10});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.init(params, {}, AdamWConfig{});
    ADD_FAILURE() << "init through a proxy to nothing succeeded";
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(s, 2.5) << e.what();
    EXPECT_EQ(std::string(e.what()).find("not a server of this job"), std::string::npos) << e.what();
  }
}

// Issue 11: a shard killed (SIGKILL) in the middle of its second checkpoint write, before the
// rename, leaves a temporary file; restarted, it removes it, resumes from the first checkpoint
// (version 5), and the worker's training completes against it: only the updates between the two
// checkpoints are lost, none is applied twice.
TEST(PsTraining, ShardKilledWhileWritingItsCheckpointResumesFromTheLastWholeOne) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::vector<std::string> server_args = {"--server.checkpoint_dir=" + d.str("ckpt"), "--server.checkpoint_every=5"};
  std::string ep;
  // Commit 1 is INIT's checkpoint (issue 26: a partition is durable before INIT is answered), 2 the
  // one at version 5; the kill comes in the third, at version 10.
  auto first_server = start_server(d, server_args, d.str("server1.log"), &ep, {"SYNCOPATE_CRASH_AT=atomic_file:commit:3"});
  test::Process& first = *first_server;
  auto a = train_args(d, corpus, d.str("w"), 2);
  a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + ep, "--train.steps=100", "--dist.timeout_s=60"});
  test::Process w(a, {"SYNCOPATE_TOKEN=t"}, d.str("w.log"));
  EXPECT_NE(first.wait(60), 0) << "the shard was to be killed at its third checkpoint";
  bool tmp_left = false;
  for (const auto& e : std::filesystem::directory_iterator(d.str("ckpt")))
    tmp_left = tmp_left || e.path().filename().string().find(".tmp.") != std::string::npos;
  EXPECT_TRUE(tmp_left) << "the kill came before the rename: a temporary file must be there";
  std::vector<std::string> again = {kBin + "/syncopate-server", "--server.port=" + ep.substr(ep.rfind(':') + 1)};
  again.insert(again.end(), server_args.begin(), server_args.end());
  test::Process second(again, {"SYNCOPATE_TOKEN=t"}, d.str("server2.log"));
  ASSERT_EQ(w.wait(120), 0) << test::slurp(d.str("w.log")) << test::slurp(d.str("server2.log"));
  EXPECT_NE(test::slurp(d.str("server2.log")).find("version 5)"), std::string::npos) << test::slurp(d.str("server2.log"));
  for (const auto& e : std::filesystem::directory_iterator(d.str("ckpt")))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  PsClient c({ep}, "t", 0, 1, client_options("t", true));
  const auto stats = nlohmann::json::parse(c.stats(0));
  // 5 updates kept, those of clocks 5..9 lost with the crash, each later one applied once.
  EXPECT_GE(stats["version"].get<int>(), 94) << stats.dump();
  EXPECT_LE(stats["version"].get<int>(), 96) << stats.dump();
}

// Issue 11: structure-aware fuzzing of the server's whole dispatch, over a real socket. Random
// sequences of requests built from interesting values (types, ids, ranges, clocks, learning
// rates, AdamW settings, frame counts, data sizes, NaN/Inf/huge values, wrong tokens) go to a live
// server (ASP with DC-ASGD and a gradient-norm bound, so every code path of a push runs). After
// every ERROR the shard's STATS must be what they were before the request (a rejected message
// changes nothing); every request but HEARTBEAT gets a reply; the server survives and its
// parameters stay finite. SYNCOPATE_FUZZ_SECONDS sets the duration (default 3 s;
// scripts/fuzz_ps.sh runs it long).
TEST(PsServer, RandomRequestSequencesNeverCrashAndRefusedOnesChangeNothing) {
  const char* env = std::getenv("SYNCOPATE_FUZZ_SECONDS");
  const double seconds = env ? std::atof(env) : 3.0;
  PsConfig pc;
  pc.mitigation = "dc_asgd";
  pc.max_grad_norm = 1e6;
  ServerConfig sc;
  sc.encrypt = "off";
  InProcessServer server(sc, pc, "t");
  const std::string endpoint = server.endpoint;
  zmq::context_t ctx;
  zmq::socket_t s = server.dealer(ctx);
  const uint64_t good = token_digest("t");
  auto request = [&](const MsgHeader& h, const std::vector<std::string>& extra) -> std::optional<MsgHeader> {
    s.send(zmq::buffer(encode_header(h)), extra.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < extra.size(); ++i)
      s.send(zmq::buffer(extra[i]), i + 1 < extra.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    // A well-formed HEARTBEAT has no reply by design; a malformed one gets an ERROR like any request.
    const bool heartbeat = h.type == static_cast<int>(MsgType::kHeartbeat);
    s.set(zmq::sockopt::rcvtimeo, heartbeat ? 50 : 5000);
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(s, std::back_inserter(parts))) {
      if (heartbeat) return std::nullopt;
      return MsgHeader{};  // type 0: no reply
    }
    return decode_reply(parts[0].data(), parts[0].size());
  };
  auto state = [&] {  // STATS without the counters of refused messages
    MsgHeader h;
    h.type = static_cast<int>(MsgType::kStats);
    h.token = good;
    auto r = request(h, {});
    EXPECT_TRUE(r && r->type == static_cast<int>(MsgType::kOk)) << "STATS answered with type " << (r ? r->type : -1) << ": "
                                                                  << (r ? r->text : "");
    auto j = nlohmann::json::parse(r && r->type == static_cast<int>(MsgType::kOk) ? r->text : "{}");
    j.erase("bad_messages");
    j.erase("rejected");
    j.erase("now_s");  // the server's clocks
    j.erase("unix_us");
    return j.dump();
  };
  std::mt19937_64 rng(2026);
  auto pick = [&](auto const& options) { return options[rng() % options.size()]; };
  auto spoil = [&] { return rng() % 8 == 0; };  // each field valid 7 times in 8: about 1 request in 5 is all valid
  const std::vector<int> types = {1, 2, 2, 2, 2, 2, 2, 3, 4, 6, 7, 0, 99};
  const std::vector<int> bad_workers = {-1, 2, 5000};
  const std::vector<int> bad_worker_counts = {0, 1, 3, 5000};
  const std::vector<int64_t> bad_lengths = {0, 8, -1, int64_t{1} << 62};
  const std::vector<int64_t> bad_offsets = {7, -1};
  const std::vector<double> bad_reals = {-1.0, std::nan(""), INFINITY, -INFINITY, 1e300, 1.0};
  const std::vector<float> bad_values = {3.4e38f, -3.4e38f, NAN, INFINITY, -INFINITY};
  int64_t sent = 0, errors = 0, unanswered = 0;
  int64_t clock = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    MsgHeader h;
    h.type = pick(types);
    h.token = spoil() ? token_digest("other") : good;
    h.worker = spoil() ? pick(bad_workers) : static_cast<int>(rng() % 2);
    h.workers = spoil() ? pick(bad_worker_counts) : 2;
    h.offset = spoil() ? pick(bad_offsets) : 0;
    h.length = spoil() ? pick(bad_lengths) : 16;
    h.clock = spoil() ? pick(std::vector<int64_t>{-1, 0, clock - 3}) : ++clock;
    h.param_version = spoil() ? -1 : static_cast<int64_t>(rng() % 50);
    h.lr = spoil() ? pick(bad_reals) : 0.01;
    h.beta1 = spoil() ? pick(bad_reals) : 0.9;
    h.beta2 = spoil() ? pick(bad_reals) : 0.95;
    h.eps = spoil() ? pick(bad_reals) : 1e-8;
    h.weight_decay = spoil() ? pick(bad_reals) : 0.1;
    h.dtype = spoil() ? "f16" : "f32";
    std::vector<std::string> extra;
    if (!spoil() || rng() % 2) {  // the data frame: the header's length of floats, or another size
      const int64_t n = spoil() ? static_cast<int64_t>(rng() % 40) : std::min<int64_t>(std::max<int64_t>(h.length, 0), 64);
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = spoil() && rng() % 4 == 0 ? pick(bad_values) : static_cast<float>(rng() % 1000) * 1e-4f - 0.05f;
      std::string f(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
      if (h.type == 1 && rng() % 3 == 0) {  // one weight-decay pair [0, 16)
        const int64_t pair[2] = {0, 16};
        f.append(reinterpret_cast<const char*>(pair), sizeof(pair));
      }
      extra.push_back(f);
    }
    if (spoil() && rng() % 2) extra.push_back("trailing");
    const std::string before = state();
    const auto r = request(h, extra);
    ++sent;
    if (!r) continue;
    if (r->type == 0) {
      ++unanswered;
      continue;
    }
    if (r->type == static_cast<int>(MsgType::kError)) {
      ++errors;
      ASSERT_EQ(state(), before) << "a refused request changed the shard: type " << h.type << ", answer: " << r->text;
    }
  }
  EXPECT_EQ(unanswered, 0);
  EXPECT_GT(sent, 100);
  EXPECT_GT(errors, 10);
  const auto final_state = nlohmann::json::parse(state());
  if (final_state.contains("version")) {  // some INIT was accepted: the values must be finite
    MsgHeader pull;
    pull.type = static_cast<int>(MsgType::kPull);
    pull.token = good;
    pull.worker = 0;
    pull.length = final_state["length"];
    pull.offset = final_state["offset"];
    s.send(zmq::buffer(encode_header(pull)), zmq::send_flags::none);
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)));
    if (parts.size() == 2) {
      const float* v = static_cast<const float*>(parts[1].data());
      for (size_t i = 0; i < parts[1].size() / 4; ++i) ASSERT_TRUE(std::isfinite(v[i])) << i;
    }
  }
  std::cout << fmt::format("[fuzz] {} requests, {} refused, in {:.0f} s\n", sent, errors, seconds);
}

// Issue 17 (live status): syncopate-server --status asks every shard for STATS without speaking as
// a worker, and names the straggler: worker 0 at clock 3, worker 1 at clock 0 -> worker 1 is 3
// behind. A dead endpoint in the list gets its own line (and exit code 3); the live shard is
// still shown.
TEST(PsStatus, NamesTheStragglerAndADeadShard) {
  InProcessServer server(ServerConfig{}, PsConfig{}, "t");
  std::vector<std::unique_ptr<PsClient>> workers;
  auto params = torch::zeros({8});
  for (int w = 0; w < 2; ++w) {
    workers.push_back(std::make_unique<PsClient>(std::vector<std::string>{server.endpoint}, "t", w, 2, client_options("t", true)));
    workers.back()->init(params, {}, AdamWConfig{});
  }
  auto g = torch::ones({8});
  for (int clock = 0; clock < 4; ++clock) push_pull(*workers[0], g, params, clock, 0.01);
  push_pull(*workers[1], g, params, 0, 0.01);
  const std::string dead = "tcp://127.0.0.1:" + std::to_string(test::free_port());  // nothing listens there
  const std::string cmd = "SYNCOPATE_TOKEN=t " + kBin + "/syncopate-server --status " + server.endpoint + "," + dead;
  auto r = test::run_command(cmd + " --json 2>&1");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.rfind("\n{") + 1));
  ASSERT_EQ(j["workers"].size(), 2u) << j.dump();
  EXPECT_EQ(j["workers"][0]["clock"], 3);
  EXPECT_EQ(j["workers"][1]["clock"], 0);
  EXPECT_EQ(j["workers"][1]["behind"], 3);
  EXPECT_EQ(j["workers"][1]["staleness"], 4);  // it read version 0; worker 0 applied four updates since
  EXPECT_EQ(j["straggler"], 1);
  EXPECT_TRUE(j["workers"][0]["alive"].get<bool>());
  EXPECT_TRUE(j["shards"][0]["ok"].get<bool>());
  EXPECT_FALSE(j["shards"][1]["ok"].get<bool>());
  EXPECT_NE(j["shards"][1]["error"].get<std::string>().find("no answer"), std::string::npos) << j.dump();
  r = test::run_command(cmd + " 2>&1");
  EXPECT_NE(r.output.find("<- straggler"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("shard " + dead + ": no answer"), std::string::npos) << r.output;
  // Asking changed nothing: no worker was added or registered by the status poll.
  const auto stats = nlohmann::json::parse(workers[0]->stats(0));
  EXPECT_EQ(stats["version"], 5);
  EXPECT_EQ(stats["bad_messages"], 0);
}

// Issue 32: a shard that answers before any worker has joined it is up, not failed: exit 0, "ok"
// true, and a line that says it waits for workers.
TEST(PsStatus, AShardWithoutWorkersYetIsUp) {
  InProcessServer server(ServerConfig{}, PsConfig{}, "t");
  const std::string cmd = "SYNCOPATE_TOKEN=t " + kBin + "/syncopate-server --status " + server.endpoint;
  auto r = test::run_command(cmd + " --json 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_TRUE(j["shards"][0]["ok"].get<bool>()) << j.dump();
  EXPECT_EQ(j["shards"][0]["waiting"], "no worker has joined yet") << j.dump();
  EXPECT_EQ(j["workers"].size(), 0u) << j.dump();
  r = test::run_command(cmd + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("shard " + server.endpoint + ": up, no worker has joined yet"), std::string::npos) << r.output;
}

// Issue 11: a ps worker killed (SIGKILL) at each phase of its step-4 checkpoint write, restarted
// as launch_node.sh does (--resume where `latest` exists), completes against the live server and
// leaves no unfinished write. Issue 15 (5): and the job ends exactly where an uninterrupted one
// does (same weights, same server version, updates, clocks and staleness): the steps between the
// checkpoint it resumed from and the crash, which the server had applied already, are recomputed
// and answered as duplicates, not applied twice.
namespace {
// One ps worker (ASP, one shard) crashed at `phase` of its step-4 checkpoint and resumed, against an
// uninterrupted one on a server of its own: returns how many steps the resumed worker replayed.
// weights_equal: the final weights must be equal bit for bit.
int expect_crash_resume_is_exactly_once(const std::string& phase, const std::vector<std::string>& extra, bool weights_equal) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string eps = start_servers(d, 1, "asp", servers), ref_eps = start_servers(d, 1, "asp", servers);
  auto worker = [&](const std::string& out, const std::string& endpoints, const std::vector<std::string>& env) {
    auto a = train_args(d, corpus, d.str(out), 2);
    a.insert(a.end(), {"--dist.mode=ps", "--dist.servers=" + endpoints, "--dist.timeout_s=20", "--checkpoint.every=2"});
    a.insert(a.end(), extra.begin(), extra.end());
    if (std::filesystem::exists(d.str(out + "/checkpoints/latest"))) a.push_back("--resume");
    std::vector<std::string> e{"SYNCOPATE_TOKEN=t"};
    e.insert(e.end(), env.begin(), env.end());
    return std::make_unique<test::Process>(a, e, d.str(out + ".log"));
  };
  EXPECT_EQ(worker("ref", ref_eps, {})->wait(120), 0) << test::slurp(d.str("ref.log"));
  EXPECT_NE(worker("w", eps, {"SYNCOPATE_CRASH_AT=checkpoint:" + phase + ":4"})->wait(120), 0);
  EXPECT_EQ(worker("w", eps, {})->wait(120), 0) << test::slurp(d.str("w.log"));
  for (const auto& e : std::filesystem::directory_iterator(d.str("w/checkpoints")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  auto stats_of = [&](const std::string& endpoints) {
    PsClient c(PsClient::parse_endpoints(endpoints), "t", 0, 1, client_options("t", true));
    return nlohmann::json::parse(c.stats(0));
  };
  const auto got = stats_of(eps), want = stats_of(ref_eps);
  for (const char* field : {"version", "updates", "clocks", "staleness_histogram", "dropped"})
    EXPECT_EQ(got[field], want[field]) << field << "\n" << got.dump() << "\n" << want.dump();
  if (weights_equal) {
    EXPECT_TRUE(torch::equal(weights(d.str("w")), weights(d.str("ref"))))
        << (weights(d.str("w")) - weights(d.str("ref"))).abs().max().item<double>();
  }
  // Resumed from step r (2 when the step-4 checkpoint was unfinished): steps r..3 were answered,
  // not applied.
  const std::string log = test::slurp(d.str("w.log"));
  const size_t at = log.find("resumed from");
  EXPECT_NE(at, std::string::npos) << log;
  if (at == std::string::npos) return -1;
  const int resumed = std::stoi(log.substr(log.find("(step ", at) + 6));
  std::cout << "[test] resumed from step " << resumed << "\n";
  EXPECT_EQ(got["duplicates"], 4 - resumed) << got.dump();
  return 4 - resumed;
}
}  // namespace

class PsCheckpointCrash : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(EveryPhase, PsCheckpointCrash, ::testing::Values("tmp_dir", "files", "rename", "latest"));
TEST_P(PsCheckpointCrash, WorkerRecoversAndEndsAsAnUninterruptedRun) {
  expect_crash_resume_is_exactly_once(GetParam(), {}, true);
}

// Issue 26 (8): the same with the int8 wire. The error-feedback residual (what rounding dropped,
// owed to the next push) is part of the worker's checkpoint, and a replayed push (a duplicate the
// server discards) does not change it. Resumed from the step-4 checkpoint ("latest": no replay),
// the run ends bit for bit where the uninterrupted one does. Resumed from step 2 (the step-4
// checkpoint unfinished), steps 2 and 3 are replayed on the servers' newer weights, so their
// residual cannot be recomputed: the ledger is exactly once, the weights are not compared
// (docs/PROTOCOL.md says so).
class PsCheckpointCrashInt8 : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(ResumedAtOrBeforeTheCrash, PsCheckpointCrashInt8, ::testing::Values("latest", "files"));
TEST_P(PsCheckpointCrashInt8, WorkerRecoversExactlyOnceAndBitForBitFromItsLastCheckpoint) {
  const int replayed = expect_crash_resume_is_exactly_once(GetParam(), {"--dist.wire=int8"}, GetParam() == "latest");
  EXPECT_EQ(replayed, GetParam() == "latest" ? 0 : 2);
}

// Issue 15 (1): BSP applies the MEAN of the clock's gradients. AdamW's first step moves each weight
// by lr*sign(g), which the sum, the mean or either gradient alone would give as well; the first
// moment does tell them apart: m = (1 - beta1) * mean(g0, g1).
TEST(ParameterShard, BspFirstMomentIsThatOfTheMeanGradient) {
  PsConfig c;
  c.consistency = "bsp";
  ParameterShard s(c);
  std::vector<float> init(4, 1.0f), g0 = {1, 2, 3, 4}, g1 = {3, -2, 5, 0};
  s.init(init_header(2, 4), init.data(), nullptr, 0);
  s.push(push_header(0, 0, 0, 4), g0.data());
  s.push(push_header(1, 0, 0, 4), g1.data());
  test::TempDir d;
  s.save(d.str("shard.safetensors"));
  auto st = load_safetensors(d.str("shard.safetensors"));
  const at::Tensor expect = torch::tensor({2.0f, 0.0f, 4.0f, 2.0f}) * (1 - 0.9);  // (1 - beta1) * mean
  EXPECT_TRUE(torch::allclose(st.tensors["exp_avg"], expect, 1e-6, 1e-7)) << st.tensors["exp_avg"];
}

// Issue 15 (3): a shard saved and loaded into a fresh one holds every field (values, both moments,
// optimizer step, version, clocks, range, settings) and answers the next push exactly as the
// original does.
namespace {
// A shard of 6 values for 2 workers (AdamW 0.8 / 0.9, eps 1e-6, decay 0.05 on the first 3), after 3 pushes.
const int64_t kSixDecay[2] = {0, 3};
MsgHeader six_init() {
  MsgHeader ih = init_header(2, 6);
  ih.beta1 = 0.8, ih.beta2 = 0.9, ih.eps = 1e-6, ih.weight_decay = 0.05;
  return ih;
}
void init_and_push_three(ParameterShard& a) {
  std::vector<float> init = {1, -1, 0.5f, 2, 0, 3};
  a.init(six_init(), init.data(), kSixDecay, 1);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g = {0.1f * step, -0.2f, 0.3f, 0.05f, -0.4f, 0.2f};
    a.push(push_header(step % 2, step, a.version(), 6), g.data());
  }
}
}  // namespace

TEST(ParameterShard, SaveThenLoadRestoresEverythingAndTheNextPushAgrees) {
  PsConfig c;
  ParameterShard a(c);
  init_and_push_three(a);
  test::TempDir d;
  a.save(d.str("s.safetensors"));
  ParameterShard b(c);
  ASSERT_TRUE(b.load(d.str("s.safetensors"), 0.0));
  EXPECT_TRUE(torch::equal(a.params(), b.params()));
  EXPECT_EQ(a.version(), b.version());
  EXPECT_EQ(a.updates(), b.updates());
  EXPECT_EQ(a.offset(), b.offset());
  EXPECT_EQ(a.length(), b.length());
  for (int w = 0; w < 2; ++w) EXPECT_EQ(a.clock(w), b.clock(w)) << w;
  auto sa = load_safetensors(d.str("s.safetensors"));
  b.save(d.str("t.safetensors"));
  auto sb = load_safetensors(d.str("t.safetensors"));
  for (const char* k : {"params", "exp_avg", "exp_avg_sq"}) EXPECT_TRUE(torch::equal(sa.tensors[k], sb.tensors[k])) << k;
  // Step, settings, decay ranges, clocks; the epoch counts restores (issue 26 (10)): one more in b.
  auto ma = nlohmann::json::parse(sa.metadata["shard"]), mb = nlohmann::json::parse(sb.metadata["shard"]);
  EXPECT_EQ(mb["epoch"], ma["epoch"].get<int64_t>() + 1);
  ma.erase("epoch");
  mb.erase("epoch");
  EXPECT_EQ(ma, mb);
  std::vector<float> g = {0.3f, 0.1f, -0.2f, 0.4f, 0.0f, -0.1f};
  a.push(push_header(1, 3, a.version(), 6), g.data());
  b.push(push_header(1, 3, b.version(), 6), g.data());
  EXPECT_TRUE(torch::equal(a.params(), b.params()));  // same moments, step and settings: bit for bit
}

// Issue 15 (4): SSP's exact schedule. A reply is held exactly while the worker's clock is more
// than s ahead of the slowest LIVE worker's: both sides of the bound, a worker that times out
// (it no longer holds the others back) and one that rejoins (it does again). A shard enforcing
// s - 1 or s + 1 fails here.
TEST(ParameterShard, SspHoldsExactlyWhenMoreThanTheBoundAheadOfTheSlowestLiveWorker) {
  PsConfig c;
  c.consistency = "ssp";
  c.staleness_bound = 2;
  c.worker_timeout_s = 10;
  ParameterShard s(c);
  std::vector<float> init(2, 0.0f), g(2, 0.1f);
  s.init(init_header(3, 2), init.data(), nullptr, 0.0);
  auto push = [&](int w, int64_t clock, double now) {
    s.seen(w, now);
    return s.push(push_header(w, clock, s.version(), 2), g.data());
  };
  using V = std::vector<int>;
  EXPECT_EQ(push(1, 0, 1), V{1});
  EXPECT_EQ(push(2, 0, 1), V{2});
  EXPECT_EQ(push(0, 0, 1), V{0});
  EXPECT_EQ(push(0, 1, 2), V{0});
  EXPECT_EQ(push(0, 2, 3), V{0});   // 2 - 0 = 2 <= s: goes on
  EXPECT_EQ(push(0, 3, 4), V{});    // 3 - 0 = 3 > s: held
  EXPECT_EQ(push(1, 1, 5), V{1});   // slowest is still worker 2 at 0: worker 0 stays held
  EXPECT_EQ(push(2, 1, 6), (V{0, 2}));  // slowest now 1: 3 - 1 = 2, worker 0 released with worker 2
  EXPECT_EQ(push(0, 4, 7), V{});    // 4 - 1 = 3 > s: held again
  EXPECT_EQ(push(1, 2, 8), V{1});   // slowest is worker 2 at 1: 4 - 1 = 3, worker 0 stays held
  // Worker 2 falls silent. A held worker never expires; the others do after 10 s of silence.
  EXPECT_EQ(s.expire(16), V{});     // worker 2 last seen at 6: 10 s, not more
  EXPECT_EQ(s.expire(17), V{0});    // 11 s: worker 2 leaves the count; slowest live = 2, 4 - 2 = 2: released
  EXPECT_EQ(s.live_workers(), 2);
  // It rejoins by speaking, and holds the others back again.
  EXPECT_EQ(push(2, 2, 18), V{2});
  EXPECT_EQ(s.live_workers(), 3);
  EXPECT_EQ(push(0, 5, 19), V{});   // 5 - 2 = 3 > s
  EXPECT_EQ(push(2, 3, 20), V{2});  // worker 1 still at 2
  EXPECT_EQ(push(1, 3, 21), (V{0, 1}));  // slowest 3: 5 - 3 = 2, released
}

// FINISH: a worker that ended its run leaves the BSP count at once (the others do not wait out
// worker_timeout_s for it), a stray heartbeat does not bring it back, and the job is over for the
// shard once every worker has finished or died.
TEST(ParameterShard, AFinishedWorkerLeavesTheBspCountAndTheLastOneEndsTheJob) {
  PsConfig c;
  c.consistency = "bsp";
  c.worker_timeout_s = 1000;
  ParameterShard s(c);
  std::vector<float> init(4, 1.0f), g(4, 1.0f);
  s.init(init_header(3, 4), init.data(), nullptr, 0, 0.0);
  EXPECT_TRUE(s.push(push_header(0, 0, 0, 4), g.data(), 1.0).empty());  // waits for workers 1 and 2
  EXPECT_TRUE(s.finish(1).empty());                                      // worker 2 still owes clock 0
  EXPECT_FALSE(s.job_done());
  s.seen(1, 2.0);  // a heartbeat that was on its way
  EXPECT_EQ(s.live_workers(), 2);
  EXPECT_EQ(s.finish(2), (std::vector<int>{0}));  // clock 0 applied with worker 0's gradient alone
  EXPECT_EQ(s.version(), 1);
  EXPECT_FALSE(s.job_done());  // worker 0 is alive and has not finished
  EXPECT_TRUE(s.push(push_header(0, 1, 1, 4), g.data(), 3.0) == std::vector<int>{0});  // alone now: no wait
  s.finish(0);
  EXPECT_TRUE(s.job_done());
  s.registered(1, 5);  // a finished worker that starts again (INIT) takes part again
  s.seen(1, 4.0);
  EXPECT_FALSE(s.job_done());
}

// server.exit_when_done: the shard ends with its job (what scripts/launch_node.sh relies on) and
// checkpoints on the way out; one worker's FINISH is not enough while another still trains.
TEST(PsServer, ExitsOnceEveryWorkerHasFinishedAndCheckpointsFirst) {
  test::TempDir dir;
  ServerConfig sc;
  sc.encrypt = "off";
  sc.exit_when_done = true;
  sc.checkpoint_dir = dir.str("ck");
  std::promise<std::string> ep;
  auto f = ep.get_future();
  auto ran = std::async(std::launch::async, [&] {
    PsServer(sc, PsConfig{}, "job").run([&ep](const std::string& e) { ep.set_value(e); });
  });
  const std::string endpoint = f.get();
  PsClient a({endpoint}, "job", 0, 2, PsClientOptions{10}), b({endpoint}, "job", 1, 2, PsClientOptions{10});
  auto pa = torch::ones({6}), pb = torch::ones({6}), g = torch::ones({6});
  a.init(pa, {}, AdamWConfig{});
  b.init(pb, {}, AdamWConfig{});
  push_pull(a, g, pa, 0, 0.01);
  a.finish(1);
  EXPECT_EQ(ran.wait_for(std::chrono::milliseconds(600)), std::future_status::timeout) << "exited while worker 1 trains";
  push_pull(b, g, pb, 0, 0.01);  // still served
  EXPECT_EQ(nlohmann::json::parse(b.stats(0))["finished"], nlohmann::json::parse("[true,false]"));
  b.finish(1);
  ASSERT_EQ(ran.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the shard did not exit";
  ran.get();
  ASSERT_TRUE(std::filesystem::exists(dir.str("ck/shard_0.safetensors")));
  ParameterShard restored{PsConfig{}};
  ASSERT_TRUE(restored.load(dir.str("ck/shard_0.safetensors"), 0.0));
  EXPECT_EQ(restored.version(), 2);
}

// INIT's layout: every worker must name the same servers, in the same order, and run the same
// model; a worker started with another list is refused by name instead of mixing ranges.
TEST(PsServer, RefusesAWorkerWhoseServerListOrModelDiffersFromTheJobs) {
  ServerConfig sc;
  sc.encrypt = "off";
  InProcessServer server(sc, PsConfig{}, "job");
  const std::string port = server.endpoint.substr(server.endpoint.rfind(':') + 1);
  PsClientOptions o{10};
  o.model_digest = "model-a";
  auto p = torch::ones({8});
  PsClient first(PsClient::parse_endpoints("127.0.0.1:" + port), "job", 0, 3, o);  // tcp:// added
  first.init(p, {}, AdamWConfig{});
  PsClient same(PsClient::parse_endpoints("tcp://127.0.0.1:" + port), "job", 1, 3, o);
  EXPECT_NO_THROW(same.init(p, {}, AdamWConfig{}));
  EXPECT_EQ(same.layout(), first.layout());
  auto refused = [&](PsClient& c, const std::string& what) {
    try {
      c.init(p, {}, AdamWConfig{});
      ADD_FAILURE() << what << " was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("job layout"), std::string::npos) << m;
      EXPECT_NE(m.find("same server list"), std::string::npos) << m;
      EXPECT_NE(m.find(first.layout()), std::string::npos) << m;
    }
  };
  PsClient renamed({"tcp://localhost:" + port}, "job", 2, 3, o);  // the same server under another name
  refused(renamed, "another server list");
  o.model_digest = "model-b";
  PsClient other_model({server.endpoint}, "job", 2, 3, o);
  refused(other_model, "another model");
}

// Bad input at start: a shard that nobody runs. The worker retries (resends) within
// dist.timeout_s, then stops with that shard's index and endpoint, not a hang or a generic error.
TEST(PsClient, AnUnreachableShardIsRetriedThenNamedWithinTheTimeout) {
  ServerConfig sc;
  sc.encrypt = "off";
  InProcessServer live(sc, PsConfig{}, "job");
  const std::string dead = "tcp://127.0.0.1:" + std::to_string(test::free_port());  // nothing listens there
  PsClientOptions o{1.5};
  o.first_resend_s = 0.3;
  PsClient c({live.endpoint, dead}, "job", 0, 1, o);
  auto p = torch::ones({16});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    c.init(p, {}, AdamWConfig{});
    FAIL() << "init succeeded without shard 1";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter server 1 (" + dead + ")"), std::string::npos) << m;
    EXPECT_NE(m.find("dist.timeout_s"), std::string::npos) << m;
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 1.4);
  EXPECT_LT(waited, 10.0);
  EXPECT_GE(c.counters().resends, 1);  // it retried before giving up
}

// Issue 16 (4): a failure on the communication thread during backward (a shard refuses a push
// made from a gradient hook) ends the node with the root cause, promptly, and tears down cleanly:
// the reducer's thread is joined before the sync object it calls into is destroyed. Run under
// AddressSanitizer by scripts/asan_check.sh (a use after free there fails it).
TEST(PsTraining, APushRefusedDuringBackwardEndsTheNodeWithTheRootCause) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--ps.consistency=asp", "--ps.max_grad_norm=1e-12"}, d.str("server.log"), &ep);
  const auto [rc, log] =
      run_ps_node(d, corpus, ep, "w", {"--dist.local_replicas=2", "--dist.ps_push_in_backward=true"}, {"NNODES=1"});
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -1) << "the node did not end within 60 s:\n" << log;
  EXPECT_NE(rc, -2) << "the node died of a signal:\n" << log;
  EXPECT_NE(log.find("refused"), std::string::npos) << log;
  EXPECT_NE(log.find("max_grad_norm"), std::string::npos) << log;  // the server's reason, named
  EXPECT_EQ(log.find("AddressSanitizer"), std::string::npos) << log;
}

// Issue 16 (4): a replica that fails in the middle of its backward while the other replica's
// communication thread is still pushing the later layers' shards: the node ends with that root
// cause, and the sync objects are torn down with the reducer thread joined first (under
// AddressSanitizer, scripts/asan_check.sh, destroying them in member order was a use after free).
TEST(PsTraining, AReplicaFailingMidBackwardEndsTheNodeWithItsCause) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--ps.consistency=asp"}, d.str("server.log"), &ep);
  for (int run = 0; run < 3; ++run) {
    const auto [rc, log] = run_ps_node(
        d, corpus, ep, fmt::format("w{}", run),
        {"--dist.local_replicas=2", "--dist.ps_push_in_backward=true", "--model.n_layer=4"},
        {"NNODES=1", "SYNCOPATE_FAIL_AT=backward:replica1:2"});
    EXPECT_EQ(rc, 1) << log;  // an error exit, not a hang (-1) or a signal (-2: ASan aborts)
    EXPECT_NE(log.find("injected failure in backward"), std::string::npos) << log;
    EXPECT_EQ(log.find("AddressSanitizer"), std::string::npos) << log;
  }
}

// Asynchronous DiLoCo with delayed Nesterov at a shard: two arrivals with N = 2 make one Nesterov
// step on their mean, also when the shard was checkpointed and restored between them (the
// accumulated pseudo-gradients and their count are part of the checkpoint).
TEST(ParameterShard, DelayedNesterovStateSurvivesACheckpoint) {
  test::TempDir d;
  PsConfig c;
  c.consistency = "asp";
  MsgHeader h = init_header(2, 4);
  h.update = "delayed_nesterov";
  h.outer_delay = 2;
  std::vector<float> init(4, 1.0f), d1 = {0.1f, 0.2f, -0.3f, 0.0f}, d2 = {0.3f, 0.0f, 0.1f, -0.2f};
  ParameterShard a(c);
  a.init(h, init.data(), nullptr, 0);
  a.push(push_header(0, 0, 0, 4), d1.data());
  a.save(d.str("shard.safetensors"));
  ParameterShard b(c);
  ASSERT_TRUE(b.load(d.str("shard.safetensors"), 0.0));
  a.push(push_header(1, 0, 0, 4), d2.data());
  b.push(push_header(1, 0, 0, 4), d2.data());
  EXPECT_TRUE(torch::equal(a.params(), b.params())) << a.params() << b.params();
  const torch::Tensor mean = (torch::tensor(d1) + torch::tensor(d2)) / 2;
  EXPECT_TRUE(torch::allclose(a.params(), torch::ones({4}) - 0.7 * 1.9 * mean, 1e-6, 1e-6)) << a.params();
  MsgHeader other = h;
  other.worker = 1;
  other.outer_delay = 3;
  EXPECT_NE(test::error_of([&] { a.init(other, init.data(), nullptr, 0); }).find("delay 3"), std::string::npos);
}

// Issue 30: in an elastic job with outer_delay 0, delayed Nesterov's N is the live members at each arrival:
// 3 workers, one FINISHes after the first arrival, and the second arrival applies the momentum on the mean
// of the two (a fixed N = 3 would wait for a third arrival that the job no longer has).
TEST(ParameterShard, ElasticDelayedNesterovCountsTheLiveMembers) {
  PsConfig c;
  c.consistency = "asp";
  MsgHeader h = init_header(3, 4);
  h.update = "delayed_nesterov";
  h.outer_delay = 0;
  h.elastic = true;
  std::vector<float> init(4, 1.0f), d1 = {0.1f, 0.2f, -0.3f, 0.0f}, d2 = {0.3f, 0.0f, 0.1f, -0.2f};
  ParameterShard a(c);
  a.init(h, init.data(), nullptr, 0);
  auto push = [](int worker) {
    MsgHeader p = push_header(worker, 0, 0, 4);
    p.samples = 4;  // an elastic job's pushes carry their sample count (the data grants)
    return p;
  };
  a.push(push(0), d1.data());
  const torch::Tensor t1 = torch::tensor(d1), t2 = torch::tensor(d2);
  EXPECT_TRUE(torch::allclose(a.params(), torch::ones({4}) - (0.7 / 3) * t1, 1e-6, 1e-6)) << a.params();
  a.finish(2);
  a.push(push(1), d2.data());
  const torch::Tensor want = torch::ones({4}) - (0.7 / 3) * t1 - (0.7 / 2) * t2 - 0.7 * 0.9 * (t1 + t2) / 2;
  EXPECT_TRUE(torch::allclose(a.params(), want, 1e-6, 1e-6)) << a.params() << want;
  MsgHeader bad = h;
  bad.outer_delay = -1;
  ParameterShard b(c);
  EXPECT_NE(test::error_of([&] { b.init(bad, init.data(), nullptr, 0); }).find("outer delay -1 invalid"), std::string::npos);
  // 0 is an elastic job's; a joiner with a fixed delay in a job of 0 (or a checkpoint of a fixed one) is refused.
  bad.outer_delay = 0;
  bad.elastic = false;
  EXPECT_NE(test::error_of([&] { b.init(bad, init.data(), nullptr, 0); }).find("not elastic"), std::string::npos);
  MsgHeader fixed = h;
  fixed.worker = 1;
  fixed.outer_delay = 3;
  EXPECT_NE(test::error_of([&] { a.init(fixed, init.data(), nullptr, 0); }).find("delay 3"), std::string::npos);
}

// Issue 26 (7): a first INIT that the server refuses (here lr = -1: check_init took any finite lr,
// check() wants 0 <= lr < 1e3) must not have created the shard: the job's real INIT, with another
// range and worker count, defines it afterwards.
TEST(PsServer, ARefusedFirstInitDoesNotCreateTheShard) {
  ServerConfig sc;
  sc.encrypt = "off";
  InProcessServer server(sc, PsConfig{}, "job");
  {
    zmq::context_t ctx;
    zmq::socket_t s = server.dealer(ctx);
    MsgHeader h = init_header(3, 4);
    h.token = token_digest("job");
    h.lr = -1;
    std::vector<float> v(4, 7.0f);
    s.send(zmq::buffer(encode_header(h)), zmq::send_flags::sndmore);
    s.send(zmq::buffer(v.data(), v.size() * sizeof(float)), zmq::send_flags::none);
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(s, std::back_inserter(parts)));
    const MsgHeader r = decode_reply(parts[0].data(), parts[0].size());
    EXPECT_EQ(r.type, static_cast<int>(MsgType::kError));
    EXPECT_NE(r.text.find("learning rate"), std::string::npos) << r.text;
  }
  PsClient c({server.endpoint}, "job", 0, 1, PsClientOptions{10});
  auto p = torch::full({10}, 2.0f);
  EXPECT_EQ(test::error_of([&] { c.init(p, {}, AdamWConfig{}); }), "");
  EXPECT_TRUE(torch::equal(p, torch::full({10}, 2.0f))) << "the shard holds the refused INIT's values: " << p;
}

// Issue 26 (7): INIT's weight-decay pairs are checked (no signed overflow on hostile input, no
// negative offset or length) before the shard changes.
TEST(ParameterShard, InitRefusesDecayPairsThatOverflowOrAreNegative) {
  std::vector<float> v(4, 1.0f);
  const int64_t bad[][2] = {{std::numeric_limits<int64_t>::max() - 1, 10}, {-5, 3}, {0, -1},
                            {1, std::numeric_limits<int64_t>::max()}};
  for (const auto& pair : bad) {
    ParameterShard s{PsConfig{}};
    const std::string e = test::error_of([&] { s.init(init_header(1, 4), v.data(), pair, 1); });
    EXPECT_NE(e.find("decay"), std::string::npos) << pair[0] << ", " << pair[1] << ": " << e;
    EXPECT_FALSE(s.initialized());
  }
  ParameterShard s{PsConfig{}};
  const int64_t ok[2] = {1, 2};
  s.init(init_header(1, 4), v.data(), ok, 1);
  EXPECT_TRUE(s.initialized());
}

// Issue 26 (9): delayed Nesterov spreads its momentum over asynchronous arrivals; under BSP or SSP
// each round would count as one arrival, which is not DiLoCo's outer step. Refused by name.
TEST(ParameterShard, DelayedNesterovIsRefusedWithBspAndSsp) {
  std::vector<float> v(4, 1.0f);
  for (const char* consistency : {"bsp", "ssp", "asp"}) {
    PsConfig c;
    c.consistency = consistency;
    ParameterShard s(c);
    MsgHeader h = init_header(2, 4);
    h.update = "delayed_nesterov";
    h.outer_delay = 2;
    const std::string e = test::error_of([&] { s.init(h, v.data(), nullptr, 0); });
    if (std::string(consistency) == "asp") {
      EXPECT_EQ(e, "");
      continue;
    }
    EXPECT_NE(e.find("delayed_nesterov"), std::string::npos) << consistency << ": " << e;
    EXPECT_NE(e.find("--ps.consistency=asp"), std::string::npos) << e;
    EXPECT_FALSE(s.initialized());
  }
}

// Issue 26 (9): BSP with backup workers assumes each worker waits for its round trip; with
// dist.ps_overlap every push is computed on the read before last and counts as late, so every
// other step would be dropped. A worker started that way is refused by name.
TEST(PsTraining, BspBackupWorkersRefuseAnOverlappedWorker) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::string ep;
  auto server = start_server(d, {"--ps.consistency=bsp", "--ps.backup_workers=1"}, d.str("server.log"), &ep);
  const auto [rc, log] = run_ps_node(d, corpus, ep, "w", {"--dist.ps_overlap=true", "--dist.timeout_s=20"}, {"NNODES=2"});
  EXPECT_EQ(rc, 1) << "rc " << rc << "\n" << log;
  EXPECT_NE(log.find("ps_overlap"), std::string::npos) << log;
  EXPECT_NE(log.find("backup_workers"), std::string::npos) << log;
}

// Issue 26 (6): a worker pushes every part before it reads a reply, and a ROUTER drops a reply
// silently when the peer's pipe is at its high-water mark (ZeroMQ's default: 1000 messages each
// way, plus what the kernel's TCP buffers hold: here up to 36 MiB, 576 replies of 64 KiB, so 2500
// parts got through before the fix and the test uses the limit instead). 4096 partitions of 64 KiB
// on one server: every reply must arrive the first time.
TEST(PsClient, ThousandsOfPartitionsOnOneServerGetEveryReplyWithoutAResend) {
  ServerConfig sc;
  sc.encrypt = "off";
  InProcessServer server(sc, PsConfig{}, "job");
  PsClientOptions o{60};
  o.partition_elems = 16384;  // 64 KiB of float32
  const int64_t parts = kMaxPartitionsPerServer;
  PsClient c({server.endpoint}, "job", 0, 1, o);
  auto p = torch::zeros({parts * o.partition_elems});
  const auto t0 = std::chrono::steady_clock::now();
  c.init(p, {}, AdamWConfig{});
  ASSERT_EQ(c.parts(), parts);
  auto g = torch::ones_like(p);
  push_pull(c, g, p, 0, 0.01);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[test] INIT and one push_pull of " << parts << " parts: " << took << " s\n";
  EXPECT_EQ(c.counters().resends, 0);
  EXPECT_TRUE(torch::allclose(p, torch::full_like(p, -0.01f), 1e-5, 1e-6)) << (p + 0.01).abs().max();
}

// Issue 26 (10): PsClient::stats takes the STATS reply only, not the reply to a push of the same
// connection that arrives first (which is kept for its wait()).
TEST(PsClient, StatsTakesItsOwnReplyAndLeavesAPushsReplyToItsWait) {
  ServerConfig sc;
  sc.encrypt = "off";
  InProcessServer server(sc, PsConfig{}, "job");
  PsClient c({server.endpoint}, "job", 0, 1, PsClientOptions{10});
  auto p = torch::ones({8}), g = torch::ones({8});
  c.init(p, {}, AdamWConfig{});
  const PsTicket t = c.push(0, g, 0, 0.01);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the push's reply is there first
  const std::string text = c.stats(0);
  const auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "stats() returned '" << text << "'";
  EXPECT_EQ(j["version"], 1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.wait(t, p).version, 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0) << "the reply was lost";
  EXPECT_EQ(c.counters().resends, 0);
}

// Issue 26 (10): the server's message size limit is below what a shard of 2^36 values needs; such
// a range is refused at INIT by name instead of ending in disconnects and resends.
TEST(ParameterShard, InitRefusesARangeBeyondTheMessageSizeLimit) {
  ParameterShard s{PsConfig{}};
  MsgHeader h = init_header(1, (int64_t{1} << 32) + 1);
  const std::string e = test::error_of([&] { s.check_init(h, nullptr); });
  EXPECT_NE(e.find("message size limit"), std::string::npos) << e;
}

// Issue 26 (10): DC-ASGD keeps two reads per worker; a worker that finished or died gets its
// copies freed, so the shard's memory stays bounded by the live workers.
TEST(ParameterShard, DcAsgdFreesTheBackupsOfFinishedAndDeadWorkers) {
  PsConfig c;
  c.mitigation = "dc_asgd";
  c.worker_timeout_s = 10;
  ParameterShard s(c);
  std::vector<float> init(4, 1.0f), g(4, 0.5f);
  s.init(init_header(3, 4), init.data(), nullptr, 0, 0.0);
  auto kept = [&] { return nlohmann::json::parse(s.stats_json(0)).value("dc_backup_values", int64_t{-1}); };
  for (int w = 0; w < 3; ++w) {
    s.pulled(w);
    s.push(push_header(w, 0, s.version(), 4), g.data(), 1.0);
    s.pulled(w);
  }
  EXPECT_EQ(kept(), 3 * 2 * 4);
  s.finish(1);
  EXPECT_EQ(kept(), 2 * 2 * 4);
  s.seen(0, 20.0);
  s.expire(20.0);  // worker 2, silent since 1.0, is dead
  EXPECT_EQ(kept(), 2 * 4);
  EXPECT_EQ(s.live_workers(), 1);
}

// Protocol 8 (issue 29): a switch into ps mode carries AdamW's state to the shards. A shard created
// by an INIT with moments (those of a shard that took 3 pushes, its values and its step count) answers
// the next push bit for bit as that shard does; a later INIT's moments are checked, not taken; moments
// with local SGD's update, non-finite ones or a negative second moment are refused by name.
TEST(ParameterShard, AnInitWithMomentsStartsAdamWFromThem) {
  PsConfig c;
  ParameterShard a(c);
  init_and_push_three(a);
  const int64_t* decay = kSixDecay;
  test::TempDir d;
  a.save(d.str("a.safetensors"));
  auto sa = load_safetensors(d.str("a.safetensors"));
  const int64_t steps = nlohmann::json::parse(sa.metadata["shard"])["opt_steps"].get<int64_t>();
  ASSERT_EQ(steps, 3);
  std::vector<float> values(6), moments(12);
  std::memcpy(values.data(), a.params().data_ptr<float>(), 6 * sizeof(float));
  std::memcpy(moments.data(), sa.tensors["exp_avg"].contiguous().data_ptr<float>(), 6 * sizeof(float));
  std::memcpy(moments.data() + 6, sa.tensors["exp_avg_sq"].contiguous().data_ptr<float>(), 6 * sizeof(float));
  MsgHeader mh = six_init();
  mh.moments = true;
  mh.adam_steps = steps;
  ParameterShard b(c), zero(c);
  b.init(mh, values.data(), decay, 1, 0.0, moments.data());
  zero.init(six_init(), values.data(), decay, 1);  // the same values, AdamW from zero (protocol 7's switch)
  std::vector<float> g = {0.3f, 0.1f, -0.2f, 0.4f, 0.0f, -0.1f};
  a.push(push_header(1, 3, a.version(), 6), g.data());
  b.push(push_header(1, 3, b.version(), 6), g.data());
  zero.push(push_header(1, 3, zero.version(), 6), g.data());
  EXPECT_TRUE(torch::equal(a.params(), b.params())) << (a.params() - b.params()).abs().max().item<double>();
  EXPECT_GT((a.params() - zero.params()).abs().max().item<double>(), 1e-4);  // the test could fail without them
  // A later INIT (another worker's) with other moments: checked, not taken.
  std::vector<float> other(12, 0.5f);
  MsgHeader later = mh;
  later.worker = 1;
  b.init(later, values.data(), decay, 1, 0.0, other.data());
  b.save(d.str("b.safetensors"));
  auto sb = load_safetensors(d.str("b.safetensors"));
  EXPECT_FALSE(torch::equal(sb.tensors["exp_avg"], torch::full({6}, 0.5f)));
  // Refused by name, changing nothing.
  auto refused = [&](MsgHeader h, std::vector<float> m) {
    ParameterShard s(c);
    const std::string e = test::error_of([&] { s.init(h, values.data(), decay, 1, 0.0, m.data()); });
    EXPECT_FALSE(s.initialized());
    return e;
  };
  MsgHeader nesterov = mh;
  nesterov.update = "nesterov";
  EXPECT_NE(refused(nesterov, moments).find("carries AdamW moments with update 'nesterov'"), std::string::npos);
  std::vector<float> nan = moments, negative = moments;
  nan[2] = std::numeric_limits<float>::quiet_NaN();
  negative[8] = -1;
  EXPECT_NE(refused(mh, nan).find("1 non-finite moments or negative second moments"), std::string::npos);
  EXPECT_NE(refused(mh, negative).find("1 non-finite moments or negative second moments"), std::string::npos);
}
