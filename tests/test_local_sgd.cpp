// Local SGD / DiLoCo (worker/sync/local_sgd_sync.cpp, common/outer_optimizer.*): the algorithm
// against a hand-applied reference over a real TCP ring, and whole training runs (nodes agree at
// round boundaries, bytes only at synchronizations, exact resume in the middle of a round).
#include <gtest/gtest.h>

#include <map>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/outer_optimizer.h"
#include "common/safetensors.h"
#include "model/flat_parameters.h"
#include "tests/test_helpers.h"
#include "worker/sync/gradient_sync.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
// torch's AdamW (weight decay 0) continuing its state from `opt`, on w, over the gradients.
void adamw_steps(torch::Tensor& w, torch::optim::AdamW& opt, const std::vector<torch::Tensor>& grads, double lr) {
  for (const auto& g : grads) {
    static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options()).lr(lr);
    w.mutable_grad() = g.clone();
    opt.step();
  }
}
}  // namespace

// The outer rules against their definitions (torch.optim.SGD with nesterov and dampening 0).
TEST(OuterOptimizer, NesterovAndAverageFollowTheirDefinitions) {
  const torch::Tensor s0 = torch::tensor({1.0f, -2.0f, 0.5f}), d1 = torch::tensor({0.1f, 0.2f, -0.3f}),
                      d2 = torch::tensor({-0.05f, 0.1f, 0.2f});
  OuterOptimizer nesterov(OuterRule::kNesterov, 0.7, 0.9, 3, torch::TensorOptions(torch::kFloat));
  torch::Tensor start = s0.clone(), params = torch::zeros({3});
  nesterov.step(start, d1, params);
  torch::Tensor m = d1.clone(), expect = s0 - 0.7 * (d1 + 0.9 * m);
  EXPECT_TRUE(torch::allclose(start, expect, 1e-6, 1e-7)) << start << expect;
  EXPECT_TRUE(torch::equal(params, start));
  nesterov.step(start, d2, params);
  m = 0.9 * m + d2;
  expect = expect - 0.7 * (d2 + 0.9 * m);
  EXPECT_TRUE(torch::allclose(start, expect, 1e-6, 1e-7)) << start << expect;
  // And torch's own SGD agrees.
  torch::Tensor w = s0.clone().set_requires_grad(true);
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true));
  for (const auto& d : {d1, d2}) {
    w.mutable_grad() = d.clone();
    sgd.step();
  }
  EXPECT_TRUE(torch::allclose(start, w.detach(), 1e-6, 1e-7));
  OuterOptimizer average(OuterRule::kAverage, 0.7, 0.9, 3, torch::TensorOptions(torch::kFloat));
  start = s0.clone();
  average.step(start, d1, params);
  EXPECT_TRUE(torch::allclose(start, s0 - d1, 1e-7, 1e-7));
  EXPECT_NE(test::error_of([] { parse_outer_rule("adam"); }).find("use average, nesterov or delayed_nesterov"),
            std::string::npos);
}

// Delayed Nesterov (asynchronous arrivals): after every N arrivals, in any order, the weights are
// exactly one Nesterov step on their mean from where the previous N left them, and torch's SGD
// fed the means agrees; in between, each arrival moved the weights by lr / N of its Delta only.
// Its state (momentum, what has been accumulated, how many) restores into a fresh optimizer.
// An elastic job's N follows its members: from 3 to 2 mid-cycle, the arrival that reaches 2 applies the
// momentum on the mean of the arrivals accumulated; from 2 to 3, the momentum waits for the third.
TEST(OuterOptimizer, DelayedNesterovFollowsAChangingDelay) {
  const torch::TensorOptions f(torch::kFloat);
  const torch::Tensor s0 = torch::tensor({1.0f, -2.0f}), d1 = torch::tensor({0.2f, 0.1f}), d2 = torch::tensor({-0.1f, 0.3f}),
                      d3 = torch::tensor({0.05f, -0.2f});
  OuterOptimizer o(OuterRule::kDelayedNesterov, 0.5, 0.9, 2, f, 3);
  torch::Tensor start = s0.clone(), params = torch::zeros({2});
  o.step(start, d1, params);
  o.set_delay(2);  // a member left
  EXPECT_EQ(o.delay(), 2);
  o.step(start, d2, params);  // the second of 2: momentum on mean(d1, d2)
  EXPECT_EQ(o.pending(), 0);
  const torch::Tensor m1 = (d1 + d2) / 2;
  EXPECT_TRUE(torch::allclose(o.momentum(), m1, 1e-6, 1e-7)) << o.momentum();
  const torch::Tensor after2 = s0 - (0.5 / 3) * d1 - (0.5 / 2) * d2 - 0.5 * 0.9 * m1;
  EXPECT_TRUE(torch::allclose(start, after2, 1e-6, 1e-6)) << start << after2;
  o.set_delay(3);  // a joiner: the next momentum waits for 3 arrivals
  o.step(start, d3, params);
  o.step(start, d3, params);
  EXPECT_EQ(o.pending(), 2);
  EXPECT_TRUE(torch::allclose(o.momentum(), m1, 1e-6, 1e-7));  // unchanged
  o.step(start, d1, params);
  EXPECT_EQ(o.pending(), 0);
  EXPECT_TRUE(torch::allclose(o.momentum(), 0.9 * m1 + (d3 + d3 + d1) / 3, 1e-6, 1e-7)) << o.momentum();
  // Two members leave with two arrivals pending (N 3 -> 1): the next arrival applies the momentum on the mean
  // of the three accumulated (a test of == instead of >= would never fire again).
  o.step(start, d1, params);
  o.step(start, d2, params);
  o.set_delay(1);
  const torch::Tensor m2 = o.momentum().clone();
  o.step(start, d3, params);
  EXPECT_EQ(o.pending(), 0);
  EXPECT_TRUE(torch::allclose(o.momentum(), 0.9 * m2 + (d1 + d2 + d3) / 3, 1e-6, 1e-7)) << o.momentum();
  o.step(start, d3, params);  // and every arrival after it, at N = 1
  EXPECT_EQ(o.pending(), 0);
  EXPECT_NE(test::error_of([&] { o.set_delay(0); }).find("outer_delay >= 1"), std::string::npos);
}

TEST(OuterOptimizer, DelayedNesterovIsOneNesterovStepPerNArrivals) {
  const torch::Tensor s0 = torch::tensor({1.0f, -2.0f, 0.5f, 3.0f});
  std::vector<torch::Tensor> d;
  for (int i = 0; i < 6; ++i) d.push_back(torch::tensor({0.1f * i, -0.2f, 0.05f * (3 - i), 0.3f}));
  const torch::TensorOptions f(torch::kFloat);
  OuterOptimizer delayed(OuterRule::kDelayedNesterov, 0.7, 0.9, 4, f, 3), nesterov(OuterRule::kNesterov, 0.7, 0.9, 4, f);
  torch::Tensor start = s0.clone(), params = torch::zeros({4}), ref = s0.clone(), ref_params = torch::zeros({4});
  delayed.step(start, d[0], params);
  EXPECT_TRUE(torch::allclose(start, s0 - (0.7 / 3) * d[0], 1e-6, 1e-7));  // no momentum yet
  delayed.step(start, d[2], params);
  delayed.step(start, d[1], params);  // the third: one Nesterov step on the mean of d0..d2
  nesterov.step(ref, (d[0] + d[1] + d[2]) / 3, ref_params);
  EXPECT_TRUE(torch::allclose(start, ref, 1e-6, 1e-6)) << start << ref;
  EXPECT_EQ(delayed.pending(), 0);
  delayed.step(start, d[3], params);
  // Checkpointed mid-cycle, restored into a fresh optimizer: the same next steps.
  OuterOptimizer restored(OuterRule::kDelayedNesterov, 0.7, 0.9, 4, f, 3);
  restored.momentum().copy_(delayed.momentum());
  restored.accumulated().copy_(delayed.accumulated());
  restored.set_pending(delayed.pending());
  torch::Tensor start2 = start.clone(), params2 = torch::zeros({4});
  for (int i = 4; i < 6; ++i) {
    delayed.step(start, d[i], params);
    restored.step(start2, d[i], params2);
  }
  nesterov.step(ref, (d[3] + d[4] + d[5]) / 3, ref_params);
  EXPECT_TRUE(torch::allclose(start, ref, 1e-6, 1e-6)) << start << ref;
  EXPECT_TRUE(torch::equal(start, start2));
  EXPECT_TRUE(torch::equal(params, start));
  // torch's SGD on the two means.
  torch::Tensor w = s0.clone().set_requires_grad(true);
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.7).momentum(0.9).nesterov(true));
  for (const auto& g : {(d[0] + d[1] + d[2]) / 3, (d[3] + d[4] + d[5]) / 3}) {
    w.mutable_grad() = g.clone();
    sgd.step();
  }
  EXPECT_TRUE(torch::allclose(start, w.detach(), 1e-6, 1e-6));
}

// Two nodes over a real TCP ring, H = 3, six steps of fixed per-node gradients, DiLoCo's Nesterov
// outer step: the weights after each round equal the hand-applied algorithm (each node's inner
// AdamW from the round's start with its state kept across rounds, the mean pseudo-gradient, the
// outer step); bytes cross only at synchronizations; node 1's different initial weights are
// replaced by node 0's at the start.
TEST(LocalSgdSync, RingDiLoCoEqualsAHandAppliedReference) {
  const int H = 3, steps = 6, nodes = 2;
  const double lr = 0.05;
  auto rings = test::tcp_ring(nodes);
  torch::manual_seed(1);
  std::vector<std::vector<torch::Tensor>> g(nodes);
  for (int n = 0; n < nodes; ++n)
    for (int t = 0; t < steps; ++t) g[n].push_back(torch::randn({3 * 2 + 2}));
  torch::Tensor w0;
  std::vector<torch::Tensor> final_w(nodes);
  std::vector<std::vector<StepSync>> log(nodes);
  std::vector<std::future<void>> fs;
  std::vector<torch::nn::Linear> models;
  for (int n = 0; n < nodes; ++n) {
    torch::manual_seed(100 + n);  // different initial weights per node
    models.emplace_back(3, 2);
  }
  {
    FlatParameters f0(*models[0]);
    w0 = f0.params.clone();
  }
  for (int n = 0; n < nodes; ++n)
    fs.push_back(std::async(std::launch::async, [&, n] {
      FlatParameters flat(*models[n]);
      SyncSetup s;
      s.dist.mode = "ring";
      s.dist.sync_every = H;
      s.dist.outer = "nesterov";
      s.optim.grad_clip = 0;
      s.optim.weight_decay = 0;
      s.ring = std::make_shared<Ring>(std::move(rings[static_cast<size_t>(n)]));
      auto sync = make_gradient_sync(s, flat, models[n]->parameters());
      sync->start(flat.params, 0);
      for (int t = 0; t < steps; ++t) {
        sync->begin_last_backward(lr, t);
        flat.grads.copy_(g[n][t]);
        log[n].push_back(sync->finish_step(flat.params, flat.grads, lr, t));
      }
      final_w[n] = flat.params.clone();
    }));
  for (auto& f : fs) f.get();
  // By hand.
  std::vector<torch::Tensor> w(nodes);
  std::vector<std::unique_ptr<torch::optim::AdamW>> inner;
  const AdamWConfig d;
  for (int n = 0; n < nodes; ++n) {
    w[n] = w0.clone().set_requires_grad(true);
    inner.push_back(std::make_unique<torch::optim::AdamW>(
        std::vector<torch::Tensor>{w[n]}, torch::optim::AdamWOptions(lr).betas({d.beta1, d.beta2}).eps(d.eps).weight_decay(0.0)));
  }
  torch::Tensor start = w0.clone(), m = torch::zeros_like(w0);
  for (int round = 0; round < steps / H; ++round) {
    torch::Tensor delta = torch::zeros_like(w0);
    for (int n = 0; n < nodes; ++n) {
      {
        torch::NoGradGuard ng;
        w[n].copy_(start);  // every node starts the round from the same weights; inner state kept
      }
      adamw_steps(w[n], *inner[static_cast<size_t>(n)],
                  std::vector<torch::Tensor>(g[n].begin() + round * H, g[n].begin() + (round + 1) * H), lr);
      delta += (start - w[n].detach()) / nodes;
    }
    m = 0.9 * m + delta;
    start = start - 0.7 * (delta + 0.9 * m);
  }
  for (int n = 0; n < nodes; ++n) {
    EXPECT_TRUE(torch::allclose(final_w[n], start, 1e-5, 1e-6)) << n << "\n" << final_w[n] << start;
    EXPECT_TRUE(torch::equal(final_w[n], final_w[0]));
    for (int t = 0; t < steps; ++t) {
      const StepSync& r = log[n][t];
      const bool syncs = (t + 1) % H == 0;
      EXPECT_EQ(r.round, (t + 1) / H) << t;
      EXPECT_EQ(r.wire_bytes > 0, syncs) << t;
      EXPECT_EQ(r.outer_norm > 0, syncs) << t;
    }
  }
  // Between rounds the nodes' weights differ (each took its own inner steps): without the
  // outer synchronization they would not agree.
  EXPECT_FALSE(torch::allclose(w[0].detach(), w[1].detach(), 1e-4, 1e-5));
}

namespace {
const std::string kWorker = test::bin_dir() + "/syncopate-worker";
std::vector<std::string> diloco_args(const test::TempDir& d, const std::string& corpus, const std::string& out) {
  return {kWorker, "--out", out, "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32",
          "--train.threads=1", "--schedule.warmup_steps=2", "--eval.every=0", "--eval.batches=1",
          "--eval.sample_tokens=0", "--checkpoint.every=2", "--dist.check_every=4", "--data.corpus=" + corpus,
          "--data.cache_dir=" + d.str("cache"), "--train.batch_size=2", "--train.steps=8", "--dist.mode=ring",
          "--dist.sync_every=4"};
}
at::Tensor weights_at(const std::string& out, int step) {
  auto st = load_safetensors(fmt::format("{}/checkpoints/step_{:06d}/model.safetensors", out, step));
  std::vector<at::Tensor> all;
  for (auto& [n, t] : st.tensors) all.push_back(t.reshape(-1));
  return torch::cat(all);
}
void run_job(const test::TempDir& d, const std::string& corpus, bool resume, const std::vector<std::string>& extra = {}) {
  const auto rendezvous = test::rendezvous_args(d);
  std::vector<std::unique_ptr<test::Process>> ps;
  for (int r = 0; r < 2; ++r) {
    auto a = diloco_args(d, corpus, d.str(fmt::format("node{}", r)));
    a.insert(a.end(), rendezvous.begin(), rendezvous.end());
    a.insert(a.end(), extra.begin(), extra.end());
    if (resume) a.push_back("--resume");
    ps.push_back(std::make_unique<test::Process>(
        a, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "NNODES=2", "NODE_RANK=" + std::to_string(r)},
        d.str(fmt::format("node{}.log", r))));
  }
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str(fmt::format("node{}.log", r)));
}
}  // namespace

// Issue 25: ring local SGD is evaluated on the weights the job would ship, the outer weights of
// the round, never a node's inner ones. Evaluated after every step (H = 4): the losses of steps
// 4..7 are one value (the outer weights do not move mid-round) although each node's inner weights
// do, step 8's differs (an outer step), and both nodes score the same weights on the same set.
TEST(LocalSgdTraining, RingDiLoCoEvaluatesTheOuterWeightsMidRound) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  run_job(d, corpus, false, {"--eval.every=1", "--eval.defer=true", "--eval.val_windows=4"});
  std::map<int64_t, double> loss[2];
  for (int n = 0; n < 2; ++n)
    for (const auto& j : test::read_jsonl(d.str(fmt::format("node{}/metrics.jsonl", n)))) {
      if (!j.contains("val_loss")) continue;
      EXPECT_EQ(j["eval_of"], "outer") << j.dump();
      EXPECT_EQ(j["val_tokens"], 4 * 32) << j.dump();
      loss[n][j["step"].get<int64_t>()] = j["val_loss"].get<double>();
    }
  ASSERT_EQ(loss[0].size(), 8u);
  for (int64_t s = 5; s <= 7; ++s) EXPECT_EQ(loss[0][s], loss[0][4]) << "step " << s;
  for (int64_t s = 1; s <= 3; ++s) EXPECT_EQ(loss[0][s], loss[0][1]) << "step " << s;  // round 1: the initial weights
  EXPECT_NE(loss[0][8], loss[0][7]);
  EXPECT_NE(loss[0][4], loss[0][3]);
  EXPECT_EQ(loss[0], loss[1]);
  // The nodes' inner weights differ mid-round (what the old evaluation scored on node 0).
  EXPECT_FALSE(torch::equal(weights_at(d.str("node0"), 6), weights_at(d.str("node1"), 6)));
  // Scored on the spot instead (the outer weights swapped into the model mid-training and its own
  // restored): the same losses, and training ends on the same weights bit for bit.
  test::TempDir e;
  run_job(e, test::write_tiny_corpus(e), false, {"--eval.every=1", "--eval.defer=false", "--eval.val_windows=4"});
  std::map<int64_t, double> spot;
  for (const auto& j : test::read_jsonl(e.str("node0/metrics.jsonl")))
    if (j.contains("val_loss")) spot[j["step"].get<int64_t>()] = j["val_loss"].get<double>();
  EXPECT_EQ(spot, loss[0]);
  EXPECT_TRUE(torch::equal(weights_at(e.str("node0"), 8), weights_at(d.str("node0"), 8)));
}

// A 2-node ring DiLoCo job (H = 4, 8 steps): the nodes agree at every round boundary (the run's
// replica check at steps 4 and 8 would fail otherwise) and differ in between; bytes leave a node
// only at the start and the two synchronizations; resumed from step 6 (in the middle of round 2,
// with the round's start and the outer momentum from the checkpoint) it ends bit for bit where
// the uninterrupted run ended.
TEST(LocalSgdTraining, RingDiLoCoAgreesAtRoundsAndResumesExactlyMidRound) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  run_job(d, corpus, false);
  const at::Tensor end0 = weights_at(d.str("node0"), 8);
  EXPECT_TRUE(torch::equal(end0, weights_at(d.str("node1"), 8)));
  EXPECT_TRUE(torch::equal(weights_at(d.str("node0"), 4), weights_at(d.str("node1"), 4)));
  EXPECT_FALSE(torch::equal(weights_at(d.str("node0"), 6), weights_at(d.str("node1"), 6)));  // mid-round: each its own
  std::istringstream lines(test::slurp(d.str("node0/metrics.jsonl")));
  int64_t sync_bytes = -1;
  int records = 0;
  for (std::string l; std::getline(lines, l);) {
    const auto j = nlohmann::json::parse(l);
    if (!j.contains("loss")) continue;
    ++records;
    const int64_t step = j["step"];
    EXPECT_EQ(j["round"], step / 4) << l;
    if (step % 4 == 0) {
      EXPECT_GT(j["wire_bytes"].get<int64_t>(), 0) << l;
      EXPECT_GT(j["outer_norm"].get<double>(), 0) << l;
      sync_bytes = j["wire_bytes"];
    } else {
      EXPECT_EQ(j["wire_bytes"], 0) << l;
    }
  }
  EXPECT_EQ(records, 8);
  const auto c = nlohmann::json::parse(test::slurp(d.str("node0/sync.json")));
  // The start's broadcast, two rounds, and the two replica checks (steps 4 and 8: 2 x world floats,
  // of which a node sends half and receives half on a ring of two: 16 bytes each).
  EXPECT_EQ(c["wire_bytes"].get<int64_t>(), 3 * sync_bytes + 2 * 16) << c.dump();

  for (int r = 0; r < 2; ++r) {  // back to step 6 on both nodes
    fs::remove_all(d.str(fmt::format("node{}/checkpoints/step_000008", r)));
    std::ofstream(d.str(fmt::format("node{}/checkpoints/latest", r))) << "step_000006\n";
  }
  run_job(d, corpus, true);
  EXPECT_NE(test::slurp(d.str("node0.log")).find("resumed from"), std::string::npos) << test::slurp(d.str("node0.log"));
  EXPECT_TRUE(torch::equal(weights_at(d.str("node0"), 8), end0))
      << (weights_at(d.str("node0"), 8) - end0).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(weights_at(d.str("node1"), 8), end0));
}

namespace {
// K syncopate-server shards (job token "t") with `consistency`, each on any free port; returns the
// endpoint list once every shard listens.
std::string start_shards(const test::TempDir& d, int k, const std::string& consistency,
                         std::vector<std::unique_ptr<test::Process>>& ps, const std::string& tag = "") {
  std::string eps;
  for (int i = 0; i < k; ++i) {
    const test::ServerPort port = test::any_server_port(d);
    std::vector<std::string> a = {test::bin_dir() + "/syncopate-server", "--server.shard=" + std::to_string(i),
                                  "--ps.consistency=" + consistency};
    a.insert(a.end(), port.args.begin(), port.args.end());
    ps.push_back(std::make_unique<test::Process>(a, std::vector<std::string>{"SYNCOPATE_TOKEN=t"},
                                                 d.str(fmt::format("server{}{}_{}.log", consistency, tag, i))));
    eps += (i ? "," : "") + test::wait_for_line(port.endpoint_file, 60, ps.back().get());
  }
  return eps;
}
void run_nodes(const test::TempDir& d, const std::string& corpus, const std::string& name, std::vector<std::string> extra) {
  std::vector<std::unique_ptr<test::Process>> ps;
  for (int r = 0; r < 2; ++r) {
    auto a = diloco_args(d, corpus, d.str(fmt::format("{}{}", name, r)));
    a.insert(a.end(), {"--train.steps=6", "--dist.sync_every=3", "--checkpoint.every=6"});
    a.insert(a.end(), extra.begin(), extra.end());
    ps.push_back(std::make_unique<test::Process>(
        a, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "NNODES=2", "NODE_RANK=" + std::to_string(r)},
        d.str(fmt::format("{}{}.log", name, r))));
  }
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str(fmt::format("{}{}.log", name, r)));
}
nlohmann::json shard_stats(const std::string& log) {  // the "[server K] stats {...}" line a stopped shard logs
  const std::string text = test::slurp(log);
  const size_t at = text.rfind("stats {");
  if (at == std::string::npos) return {};
  return nlohmann::json::parse(text.substr(at + 6, text.find('\n', at) - at - 6));
}
}  // namespace

// Synchronous DiLoCo through BSP parameter servers (the shards average the nodes' pseudo-gradients
// of a round and apply the outer Nesterov step on their ranges) equals ring DiLoCo; asynchronous
// local SGD (ASP: each pseudo-gradient applied on arrival) completes with every node's Delta of
// every round applied exactly once (shard version = nodes x rounds).
TEST(LocalSgdTraining, PsBspDiLoCoEqualsRingDiLoCoAndAspAppliesEveryDeltaOnce) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string bsp = start_shards(d, 2, "bsp", servers), asp = start_shards(d, 2, "asp", servers);
  const auto rendezvous = test::rendezvous_args(d);
  run_nodes(d, corpus, "ring", rendezvous);
  run_nodes(d, corpus, "bsp", {"--dist.mode=ps", "--dist.servers=" + bsp});
  run_nodes(d, corpus, "asp", {"--dist.mode=ps", "--dist.servers=" + asp});
  const at::Tensor ring = weights_at(d.str("ring0"), 6), ps = weights_at(d.str("bsp0"), 6);
  EXPECT_TRUE(torch::equal(ps, weights_at(d.str("bsp1"), 6)));
  EXPECT_TRUE(torch::allclose(ps, ring, 1e-5, 1e-6)) << (ps - ring).abs().max().item<double>();
  for (auto& s : servers) {
    ::kill(s->pid(), SIGTERM);  // the shards log their statistics on the way out
    EXPECT_EQ(s->wait(30), 0);
  }
  for (int k = 0; k < 2; ++k) {
    const auto b = shard_stats(d.str(fmt::format("serverbsp_{}.log", k))), a = shard_stats(d.str(fmt::format("serverasp_{}.log", k)));
    EXPECT_EQ(b["update"], "nesterov") << b.dump();
    EXPECT_EQ(b["version"], 2) << b.dump();  // one outer step per round
    EXPECT_EQ(a["version"], 4) << a.dump();  // one per node and round
    EXPECT_EQ(a["duplicates"], 0) << a.dump();
  }
  // Bytes: a node sends its Delta twice (rounds 1 and 2) and nothing in between.
  std::istringstream lines(test::slurp(d.str("asp0/metrics.jsonl")));
  for (std::string l; std::getline(lines, l);) {
    const auto j = nlohmann::json::parse(l);
    if (j.contains("loss")) EXPECT_EQ(j["wire_bytes"].get<int64_t>() > 0, j["step"].get<int64_t>() % 3 == 0) << l;
  }
}

// Parameter-server DiLoCo resumed in the middle of a round: two nodes (H = 3, 6 steps, BSP shards)
// die right after their step-4 checkpoint (one inner step into round 2); restarted with --resume
// against the same shards (which applied round 1 once and keep it), they end at step 6 bit for bit
// where an uninterrupted job against fresh shards ended, and the shards applied each round once.
TEST(LocalSgdTraining, PsDiLoCoResumesExactlyMidRound) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> servers;
  const std::string fresh = start_shards(d, 2, "bsp", servers);
  run_nodes(d, corpus, "full", {"--dist.mode=ps", "--dist.servers=" + fresh, "--checkpoint.every=2"});
  std::vector<std::unique_ptr<test::Process>> others;
  const std::string eps = start_shards(d, 2, "bsp", others, "cut");
  auto node = [&](int r, bool resume, std::vector<std::string> env) {
    auto a = diloco_args(d, corpus, d.str(fmt::format("cut{}", r)));
    a.insert(a.end(), {"--train.steps=6", "--dist.sync_every=3", "--checkpoint.every=2", "--dist.mode=ps",
                       "--dist.servers=" + eps});
    if (resume) a.push_back("--resume");
    env.insert(env.end(), {"SYNCOPATE_TOKEN=t", "NNODES=2", "NODE_RANK=" + std::to_string(r)});
    return std::make_unique<test::Process>(a, env, d.str(fmt::format("cut{}_{}.log", r, resume ? 1 : 0)));
  };
  {
    auto a = node(0, false, {"SYNCOPATE_CRASH_AT=checkpoint:latest:4"}), b = node(1, false, {"SYNCOPATE_CRASH_AT=checkpoint:latest:4"});
    EXPECT_EQ(a->wait(120), -2);  // killed by its own crash point, after the step-4 checkpoint
    EXPECT_EQ(b->wait(120), -2);
  }
  {
    auto a = node(0, true, {}), b = node(1, true, {});
    ASSERT_EQ(a->wait(120), 0) << test::slurp(d.str("cut0_1.log"));
    ASSERT_EQ(b->wait(120), 0) << test::slurp(d.str("cut1_1.log"));
  }
  EXPECT_NE(test::slurp(d.str("cut0_1.log")).find("resumed from"), std::string::npos) << test::slurp(d.str("cut0_1.log"));
  const at::Tensor full = weights_at(d.str("full0"), 6);
  EXPECT_TRUE(torch::equal(weights_at(d.str("cut0"), 6), full)) << (weights_at(d.str("cut0"), 6) - full).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(weights_at(d.str("cut1"), 6), full));
  EXPECT_FALSE(torch::equal(weights_at(d.str("full0"), 4), weights_at(d.str("full1"), 4)));  // step 4 was mid-round
  for (auto& s : others) {
    ::kill(s->pid(), SIGTERM);
    EXPECT_EQ(s->wait(30), 0);
  }
  for (int k = 0; k < 2; ++k) {
    const auto st = shard_stats(d.str(fmt::format("serverbspcut_{}.log", k)));
    EXPECT_EQ(st["version"], 2) << st.dump();  // two rounds, each applied once
  }
}

// Asynchronous local SGD across a shard's death: two nodes (H = 3, 12 steps: 4 rounds each) push
// pseudo-gradients to two ASP shards that checkpoint after every update; shard 0 is killed
// mid-run and restarted on its port from its checkpoint. Both nodes finish, and every node's Delta
// of every round was applied exactly once on both shards (version = nodes x rounds = 8): the
// resends of what the dead shard had not answered are applied once, none twice.
TEST(LocalSgdTraining, AsyncDiLoCoAppliesEveryDeltaOnceAcrossAShardRestart) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  std::vector<std::unique_ptr<test::Process>> shards;
  std::vector<std::string> eps;
  auto shard_args = [&](int i) {
    return std::vector<std::string>{test::bin_dir() + "/syncopate-server", "--server.shard=" + std::to_string(i),
                                    "--ps.consistency=asp", "--server.checkpoint_dir=" + d.str(fmt::format("ck{}", i)),
                                    "--server.checkpoint_every=1"};
  };
  for (int i = 0; i < 2; ++i) {
    const test::ServerPort port = test::any_server_port(d);
    auto a = shard_args(i);
    a.insert(a.end(), port.args.begin(), port.args.end());
    shards.push_back(std::make_unique<test::Process>(a, std::vector<std::string>{"SYNCOPATE_TOKEN=t"}, d.str(fmt::format("s{}.log", i))));
    eps.push_back(test::wait_for_line(port.endpoint_file, 60, shards.back().get()));
  }
  std::vector<std::unique_ptr<test::Process>> nodes;
  for (int r = 0; r < 2; ++r) {
    auto a = diloco_args(d, corpus, d.str(fmt::format("n{}", r)));
    a.insert(a.end(), {"--train.steps=12", "--dist.sync_every=3", "--checkpoint.every=6", "--dist.mode=ps",
                       "--dist.servers=" + eps[0] + "," + eps[1], "--dist.outer=delayed_nesterov", "--dist.outer_lr=0.35",
                       "--dist.timeout_s=60"});
    nodes.push_back(std::make_unique<test::Process>(
        a, std::vector<std::string>{"SYNCOPATE_TOKEN=t", "NNODES=2", "NODE_RANK=" + std::to_string(r)},
        d.str(fmt::format("n{}.log", r))));
  }
  ASSERT_TRUE(test::wait_for_step(d.str("n0"), 5, 60)) << test::slurp(d.str("n0.log"));
  shards[0]->kill_hard();
  shards[0]->wait(10);
  std::vector<std::string> again = shard_args(0);
  again.push_back("--server.port=" + eps[0].substr(eps[0].rfind(':') + 1));
  shards[0] = std::make_unique<test::Process>(again, std::vector<std::string>{"SYNCOPATE_TOKEN=t"}, d.str("s0b.log"));
  for (int r = 0; r < 2; ++r) ASSERT_EQ(nodes[r]->wait(120), 0) << test::slurp(d.str(fmt::format("n{}.log", r)));
  EXPECT_NE(test::slurp(d.str("s0b.log")).find("resumed from"), std::string::npos) << test::slurp(d.str("s0b.log"));
  for (auto& s : shards) {
    ::kill(s->pid(), SIGTERM);
    EXPECT_EQ(s->wait(30), 0);
  }
  for (const char* log : {"s0b.log", "s1.log"}) {
    const auto st = shard_stats(d.str(log));
    EXPECT_EQ(st["version"], 8) << log << ": " << st.dump();
    EXPECT_EQ(st["update"], "delayed_nesterov") << st.dump();
  }
}
