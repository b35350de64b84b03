// The elastic ring (dist.elastic with dist.mode=ring; issue 30) with real processes on loopback:
// syncopate-rendezvous and syncopate-worker nodes. A node killed with SIGKILL, a node joining the
// running job, a node preempted with SIGTERM and the killed one coming back with --resume: nobody
// restarts, the ring re-forms at step boundaries, every member holds the same weights after every
// step (dist.check_every=1 fails the job otherwise), the data order holds, and a node of another
// model is refused without disturbing the ring. Local SGD / DiLoCo on the elastic ring
// (dist.sync_every > 1): the same events, taking effect at round boundaries, the survivors of a
// lost node applying their round with their own deltas.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include <ATen/ATen.h>

#include "common/safetensors.h"
#include "test_helpers.h"

namespace syncopate {
namespace {
namespace fs = std::filesystem;

std::vector<nlohmann::json> steps_of(const std::string& out) {
  std::vector<nlohmann::json> r;
  std::istringstream lines(test::slurp(out + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {  // a line still being written does not parse: skipped
    const auto m = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (m.is_object() && m.contains("loss")) r.push_back(m);
  }
  return r;
}
int64_t last_step(const std::string& out) {
  const auto s = steps_of(out);
  return s.empty() ? -1 : s.back().at("step").get<int64_t>();
}
bool wait_until(const std::function<bool()>& f, double timeout_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return f();
}
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every node that took a step took it with the others (node 0's steps `s0`): the same first sample and world.
void expect_steps_taken_together(const test::TempDir& d, const std::vector<nlohmann::json>& s0) {
  std::map<int64_t, std::pair<int64_t, int>> by_step;
  for (const auto& m : s0) by_step[m.at("step").get<int64_t>()] = {m.at("data_position").get<int64_t>(), m.at("world").get<int>()};
  for (const std::string& w : {"w1", "w2", "w3"})
    for (const auto& m : steps_of(d.str(w))) {
      const auto it = by_step.find(m.at("step").get<int64_t>());
      if (it == by_step.end()) continue;
      EXPECT_EQ(it->second.first, m.at("data_position").get<int64_t>()) << w << " step " << m.at("step");
      EXPECT_EQ(it->second.second, m.at("world").get<int>()) << w << " step " << m.at("step");
    }
}

// A rendezvous service and the nodes of one elastic ring job (NNODES=3 at the start) in `d`.
struct ElasticJob {
  static constexpr int kSteps = 200, kBatch = 2;
  test::TempDir& d;
  std::vector<std::string> extra;  // further worker flags (local SGD's)
  std::string name;                // the service's files: DIR/<name>.port, DIR/<name>.log
  std::string corpus = test::write_tiny_corpus(d), bin = test::bin_dir(), port_file = d.str(name + ".port");
  std::vector<std::string> env = {"SYNCOPATE_TOKEN=t"};
  test::Process service{{bin + "/syncopate-rendezvous", "--port", "-1", "--port-file", port_file}, env,
                        d.str(name + ".log")};
  ElasticJob(test::TempDir& dir, std::vector<std::string> flags, std::string service_name = "rendezvous")
      : d(dir), extra(std::move(flags)), name(std::move(service_name)) {
    test::wait_for_line(port_file, 30, &service);
  }
  ~ElasticJob() { service.kill_hard(); }
  // A worker's flags: the job's (elastic, through this service) or, with `fixed` (test::rendezvous_args,
  // the same for every node), a fixed ring's with its own rendezvous on node 0.
  std::vector<std::string> args(const std::string& out, const std::string& width = "32", int steps = kSteps,
                                int checkpoint_every = 10, double step_time_s = 0.1,
                                const std::vector<std::string>& fixed = {}) {
    std::vector<std::string> a = {bin + "/syncopate-worker", "--out", out, "--model.n_embd=" + width, "--model.n_head=2",
                                  "--model.block_size=32", "--train.threads=1", "--schedule.warmup_steps=2",
                                  "--eval.every=0", "--eval.batches=1", "--eval.sample_tokens=0",
                                  "--checkpoint.every=" + std::to_string(checkpoint_every),
                                  "--data.corpus=" + corpus, "--data.cache_dir=" + d.str("cache"),
                                  "--train.steps=" + std::to_string(steps), "--train.batch_size=" + std::to_string(kBatch),
                                  fmt::format("--emulate.step_time_s={}", step_time_s), "--dist.mode=ring",
                                  "--dist.master_addr=127.0.0.1", "--dist.timeout_s=30", "--dist.check_every=1",
                                  "--train.preempt_grace_s=30"};
    const std::vector<std::string> how =
        fixed.empty() ? std::vector<std::string>{"--dist.elastic=true", "--dist.master_port=-1",
                                                 "--dist.rendezvous_file=" + port_file, "--dist.reform_wait_s=5"}
                      : fixed;
    a.insert(a.end(), how.begin(), how.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::unique_ptr<test::Process> start(int rank, std::vector<std::string> a, const std::string& log, int nnodes = 3) {
    std::vector<std::string> e = env;
    e.push_back(fmt::format("NNODES={}", nnodes));
    e.push_back(fmt::format("NODE_RANK={}", rank));
    return std::make_unique<test::Process>(a, e, log);
  }
  std::unique_ptr<test::Process> node(int rank, bool resume = false, const std::string& width = "32") {
    auto a = args(d.str(fmt::format("w{}", rank)), width);
    if (resume) a.push_back("--resume");
    return start(rank, a, d.str(fmt::format("w{}.log{}", rank, resume ? ".2" : "")));
  }
};

TEST(ElasticRing, NodesDieJoinLeaveAndComeBackWhileTheRingGoesOn) {
  test::TempDir d;
  ElasticJob job(d, {});
  constexpr int kSteps = ElasticJob::kSteps, kBatch = ElasticJob::kBatch;
  auto node = [&](int rank, bool resume = false, const std::string& width = "32") { return job.node(rank, resume, width); };
  auto w0 = node(0), w1 = node(1), w2 = node(2);
  ASSERT_TRUE(wait_until([&] { return last_step(d.str("w0")) >= 20; }, 120)) << test::slurp(d.str("w0.log"));

  // SIGKILL: no goodbye; the survivors re-form at once (the service sees the session close).
  w1->kill_hard();
  const int64_t killed_at = last_step(d.str("w0"));
  EXPECT_TRUE(wait_until([&] { return last_step(d.str("w0")) >= killed_at + 10; }, 15))
      << "the survivors go on within seconds\n" << test::slurp(d.str("w0.log")) << test::slurp(d.str("rendezvous.log"));

  // Another model's node is refused by name; the ring does not notice.
  auto stranger = node(9, false, "48");
  EXPECT_NE(stranger->wait(60), 0);
  EXPECT_NE(test::slurp(d.str("w9.log")).find("another model/config"), std::string::npos) << test::slurp(d.str("w9.log"));

  // A new node joins the running job.
  auto w3 = node(3);
  ASSERT_TRUE(wait_until([&] { return steps_of(d.str("w3")).size() >= 5; }, 60))
      << test::slurp(d.str("w3.log")) << test::slurp(d.str("rendezvous.log"));

  // SIGTERM: node 2 leaves at a step boundary, checkpointed, exit 0; the others do not wait for it.
  ::kill(w2->pid(), SIGTERM);
  EXPECT_EQ(w2->wait(30), 0) << test::slurp(d.str("w2.log"));
  const int64_t left_at = last_step(d.str("w2"));
  EXPECT_TRUE(wait_until([&] { return last_step(d.str("w0")) >= left_at + 5; }, 15)) << test::slurp(d.str("w0.log"));

  // Node 1 comes back from its checkpoint and takes the job's state.
  auto w1b = node(1, /*resume=*/true);
  EXPECT_EQ(w0->wait(120), 0) << test::slurp(d.str("w0.log"));
  EXPECT_EQ(w3->wait(60), 0) << test::slurp(d.str("w3.log"));
  EXPECT_EQ(w1b->wait(60), 0) << test::slurp(d.str("w1.log.2"));
  const std::string log0 = test::slurp(d.str("w0.log")), log1b = test::slurp(d.str("w1.log.2")),
                    log3 = test::slurp(d.str("w3.log")), service_log = test::slurp(d.str("rendezvous.log"));
  EXPECT_NE(log3.find("joined the running job at step"), std::string::npos) << log3;
  EXPECT_NE(log1b.find("its checkpoint was at step"), std::string::npos) << log1b;
  EXPECT_NE(test::slurp(d.str("w2.log")).find("it left the ring"), std::string::npos);
  // Epochs: the start, the kill, the join, the leave, the return (a re-formation that broke off
  // would add one).
  EXPECT_GE(count(service_log, "[rendezvous] epoch "), 5u) << service_log;
  EXPECT_EQ(count(log0, "broke off"), 0u) << log0;

  // Node 0 was a member throughout: its steps run to the end; each took world x batch samples
  // from the job's order, the next step starting where it ended (none twice, none skipped).
  const auto s0 = steps_of(d.str("w0"));
  ASSERT_FALSE(s0.empty());
  EXPECT_EQ(s0.back().at("step"), kSteps);
  std::set<int> worlds;
  int jumps = 0;
  for (size_t i = 0; i < s0.size(); ++i) {
    worlds.insert(s0[i].at("world").get<int>());
    if (i == 0) continue;
    const int64_t step = s0[i].at("step").get<int64_t>(), prev = s0[i - 1].at("step").get<int64_t>();
    ASSERT_GT(step, prev);
    if (step != prev + 1) {  // node 0 abandoned a step that another member completed: it took that member's state
      ++jumps;
      continue;
    }
    EXPECT_EQ(s0[i].at("data_position").get<int64_t>(),
              s0[i - 1].at("data_position").get<int64_t>() + s0[i - 1].at("world").get<int64_t>() * kBatch)
        << "step " << step;
  }
  EXPECT_LE(jumps, 1);
  EXPECT_EQ(worlds, (std::set<int>{2, 3})) << "three nodes, two after the kill, three with the joiner, two after the "
                                              "leave, three with the return";
  expect_steps_taken_together(d, s0);
  const auto s3 = steps_of(d.str("w3"));
  EXPECT_GT(s3.front().at("step").get<int64_t>(), 25) << "the joiner starts at the job's step, not at 0";
}


// Local SGD / DiLoCo on the elastic ring (dist.sync_every = 4, Nesterov outer step): a node killed
// in the middle of a round, a joiner, a node preempted in the middle of a round, the killed one
// back with --resume. The survivors apply each broken round themselves, averaging the deltas of
// the nodes that completed it; membership changes only at round boundaries; the members hold the
// same weights at every round boundary (dist.check_every=1 checks them there); the data order holds.
TEST(ElasticRing, LocalSgdRoundsGoOnAsNodesDieJoinAndLeave) {
  test::TempDir d;
  constexpr int kH = 4;
  ElasticJob job(d, {"--dist.sync_every=" + std::to_string(kH), "--dist.outer=nesterov", "--dist.outer_lr=0.7",
                     "--dist.outer_momentum=0.9"});
  constexpr int kSteps = ElasticJob::kSteps, kBatch = ElasticJob::kBatch;
  // Past a round boundary by `into` steps (node 0's last logged step).
  auto mid_round = [&](int64_t after, int into) {
    return wait_until([&] { const int64_t s = last_step(d.str("w0")); return s >= after && s % kH == into; }, 60);
  };
  auto w0 = job.node(0), w1 = job.node(1), w2 = job.node(2);
  ASSERT_TRUE(mid_round(20, 1)) << test::slurp(d.str("w0.log"));
  w1->kill_hard();  // found at the round's sum
  const int64_t killed_at = last_step(d.str("w0"));
  EXPECT_TRUE(wait_until([&] { return last_step(d.str("w0")) >= killed_at + 10; }, 20))
      << test::slurp(d.str("w0.log")) << test::slurp(d.str("rendezvous.log"));
  auto w3 = job.node(3);  // joins at a round boundary
  ASSERT_TRUE(wait_until([&] { return steps_of(d.str("w3")).size() >= 6; }, 60))
      << test::slurp(d.str("w3.log")) << test::slurp(d.str("rendezvous.log"));
  ASSERT_TRUE(mid_round(last_step(d.str("w0")) + 1, 1));
  ::kill(w2->pid(), SIGTERM);  // leaves at once, its partial round dropped
  EXPECT_EQ(w2->wait(30), 0) << test::slurp(d.str("w2.log"));
  const int64_t left_at = last_step(d.str("w2"));
  EXPECT_TRUE(wait_until([&] { return last_step(d.str("w0")) >= left_at + 8; }, 20)) << test::slurp(d.str("w0.log"));
  auto w1b = job.node(1, /*resume=*/true);
  EXPECT_EQ(w0->wait(120), 0) << test::slurp(d.str("w0.log"));
  EXPECT_EQ(w3->wait(60), 0) << test::slurp(d.str("w3.log"));
  EXPECT_EQ(w1b->wait(60), 0) << test::slurp(d.str("w1.log.2"));
  const std::string log0 = test::slurp(d.str("w0.log")), log2 = test::slurp(d.str("w2.log")),
                    log3 = test::slurp(d.str("w3.log")), log1b = test::slurp(d.str("w1.log.2"));
  EXPECT_NE(log2.find("in the middle of a round"), std::string::npos) << log2;
  EXPECT_NE(log3.find("joined the running job at step"), std::string::npos) << log3;
  EXPECT_NE(log1b.find("its checkpoint was at step"), std::string::npos) << log1b;
  // The kill and the leave each broke a round that the survivors then applied themselves.
  EXPECT_EQ(count(log0, "applied by the 2 member(s) that completed it"), 2u) << log0;
  const std::string norm_is = "mean pseudo-gradient's norm ";
  for (size_t at = log0.find(norm_is); at != std::string::npos; at = log0.find(norm_is, at + 1))
    EXPECT_GT(std::stod(log0.substr(at + norm_is.size(), 12)), 0) << "their deltas, not zeros: " << log0.substr(at, 60);
  EXPECT_EQ(count(log0, "broke off"), 0u) << log0;

  const auto s0 = steps_of(d.str("w0"));
  ASSERT_FALSE(s0.empty());
  EXPECT_EQ(s0.back().at("step"), kSteps);
  std::set<int> worlds;
  int jumps = 0;
  for (size_t i = 0; i < s0.size(); ++i) {
    const int64_t step = s0[i].at("step").get<int64_t>();
    worlds.insert(s0[i].at("world").get<int>());
    // Every round node 0 logged the end of was applied there with a nonzero outer step.
    EXPECT_EQ(s0[i].at("round").get<int64_t>(), step / kH) << "step " << step;
    if (step % kH == 0) EXPECT_GT(s0[i].at("outer_norm").get<double>(), 0) << "step " << step;
    if (i == 0) continue;
    const int64_t prev = s0[i - 1].at("step").get<int64_t>();
    ASSERT_GT(step, prev);
    // A broken round's last step is not logged (the trainer takes the position regroup() returns);
    // the data order still advances by what the members of each step took, none skipped or twice.
    if (step != prev + 1) {
      ++jumps;
      EXPECT_EQ(step, prev + 2) << "only a round's last step is redone elsewhere";
      EXPECT_EQ(step % kH, 1) << "the missing step ends a round";
    }
    EXPECT_EQ(s0[i].at("data_position").get<int64_t>(),
                s0[i - 1].at("data_position").get<int64_t>() + (step - prev) * s0[i - 1].at("world").get<int64_t>() * kBatch)
          << "step " << step;
    if (s0[i].at("world") != s0[i - 1].at("world")) EXPECT_EQ((step - 1) % kH, 0) << "membership changes at round boundaries";
  }
  EXPECT_EQ(jumps, 2);
  EXPECT_EQ(worlds, (std::set<int>{2, 3}));
  expect_steps_taken_together(d, s0);
  const auto s3 = steps_of(d.str("w3"));
  EXPECT_EQ((s3.front().at("step").get<int64_t>() - 1) % kH, 0) << "the joiner's first step starts a round";
}


// Without membership events elastic local SGD is local SGD, and the elastic ring the ring: after a
// switch into either in the middle of a round (from local SGD with another H: the nodes' weights
// differ, so every member starts from the job's mean weights, and the ring from the mean moments
// too), two nodes end with the fixed ring's weights bit for bit.
TEST(ElasticRing, LocalSgdWithoutEventsIsTheFixedRingsLocalSgdBitForBit) {
  test::TempDir d;
  ElasticJob job(d, {"--dist.outer=nesterov", "--dist.outer_lr=0.7", "--dist.outer_momentum=0.9"});
  auto run = [&](const std::string& tag, bool elastic, int steps, const std::vector<std::string>& more,
                 ElasticJob* on = nullptr) {
    ElasticJob& j = on ? *on : job;
    const std::vector<std::string> fixed = elastic ? std::vector<std::string>{} : test::rendezvous_args(d);
    std::vector<std::unique_ptr<test::Process>> ps;
    for (int r = 0; r < 2; ++r) {
      auto a = j.args(d.str(tag + std::to_string(r)), "32", steps, 2, 0, fixed);
      a.insert(a.end(), more.begin(), more.end());
      ps.push_back(j.start(r, a, d.str(tag + std::to_string(r) + ".log"), 2));
    }
    for (int r = 0; r < 2; ++r) ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str(tag + std::to_string(r) + ".log"));
  };
  auto weights = [&](const std::string& out, int step) {
    auto st = load_safetensors(fmt::format("{}/checkpoints/step_{:06d}/model.safetensors", out, step));
    std::vector<at::Tensor> all;
    for (auto& [name, t] : st.tensors) all.push_back(t.reshape(-1));
    return at::cat(all);
  };
  run("f", false, 6, {"--dist.sync_every=3"});
  ASSERT_FALSE(at::equal(weights(d.str("f0"), 4), weights(d.str("f1"), 4))) << "the switch would not test the mean";
  for (int r = 0; r < 2; ++r) {  // the job resumes from its step-4 checkpoint, mid-round
    fs::remove_all(d.str("f" + std::to_string(r) + "/checkpoints/step_000006"));
    std::ofstream(d.str("f" + std::to_string(r) + "/checkpoints/latest")) << "step_000004\n";
    for (const char* copy : {"e", "g", "h"})
      fs::copy(d.str("f" + std::to_string(r)), d.str(copy + std::to_string(r)), fs::copy_options::recursive);
  }
  run("f", false, 8, {"--dist.sync_every=2", "--resume"});
  run("e", true, 8, {"--dist.sync_every=2", "--resume"});
  // The same switch into the per-step ring: fixed (RingSync::start: the mean weights and moments) and elastic.
  run("g", false, 8, {"--resume"});
  ElasticJob second(d, job.extra, "rendezvous2");  // (a service ends its job once: a job that finished takes no node)
  run("h", true, 8, {"--resume"}, &second);
  EXPECT_NE(test::slurp(d.str("e0.log")).find("switching from ring local SGD (sync_every=3"), std::string::npos)
      << test::slurp(d.str("e0.log"));
  for (int step : {6, 8})
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(at::equal(weights(d.str("f" + std::to_string(r)), step), weights(d.str("e" + std::to_string(r)), step)))
          << "local SGD, node " << r << " step " << step;
      EXPECT_TRUE(at::equal(weights(d.str("g" + std::to_string(r)), step), weights(d.str("h" + std::to_string(r)), step)))
          << "per-step ring, node " << r << " step " << step;
    }
}

}  // namespace
}  // namespace syncopate
