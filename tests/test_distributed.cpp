// Ring mode with real processes on loopback: n nodes with per-node batch b end with the weights of
// one process with batch n*b; replicas stay identical; a dead node or a mismatched config is a
// prompt, named error.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/safetensors.h"
#include "worker/sync/dist_config.h"
#include "tests/test_helpers.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
const std::string kWorker = test::bin_dir() + "/syncopate-worker";

std::vector<std::string> worker_args(const test::TempDir& d, const std::string& corpus, const std::string& out, int batch,
                                     int steps, int accum) {
  return {kWorker, "--out", out, "--model.n_embd=32", "--model.n_head=2", "--model.block_size=32",
          "--train.threads=1", "--schedule.warmup_steps=2", "--eval.every=0", "--eval.batches=1",
          "--eval.sample_tokens=0", "--checkpoint.every=0", "--dist.check_every=2",
          "--data.corpus=" + corpus, "--data.cache_dir=" + d.str("cache"),
          "--train.batch_size=" + std::to_string(batch), "--train.steps=" + std::to_string(steps),
          "--train.grad_accum=" + std::to_string(accum)};
}

// Starts `nodes` ring workers, node r with args_for(r); logs DIR/node<r>.log. The rendezvous is on
// any free port, which node 0 publishes through a fresh file (test::rendezvous_args).
std::vector<std::unique_ptr<test::Process>> start_ring(const test::TempDir& d, int nodes,
                                                       const std::function<std::vector<std::string>(int)>& args_for,
                                                       const std::function<std::vector<std::string>(int)>& env_for = {}) {
  std::vector<std::unique_ptr<test::Process>> ps;
  const std::vector<std::string> rendezvous = test::rendezvous_args(d);
  for (int r = 0; r < nodes; ++r) {
    auto args = args_for(r);
    args.push_back("--dist.mode=ring");
    args.insert(args.end(), rendezvous.begin(), rendezvous.end());
    std::vector<std::string> env{"MASTER_ADDR=127.0.0.1", "NNODES=" + std::to_string(nodes),
                                 "NODE_RANK=" + std::to_string(r), "SYNCOPATE_TOKEN=test"};
    if (env_for)
      for (auto& e : env_for(r)) env.push_back(e);
    ps.push_back(std::make_unique<test::Process>(args, env, d.str("node" + std::to_string(r) + ".log")));
  }
  return ps;
}

at::Tensor final_weights(const std::string& out, int steps) {
  auto st = load_safetensors(fmt::format("{}/checkpoints/step_{:06d}/model.safetensors", out, steps));
  std::vector<at::Tensor> all;
  for (auto& [name, t] : st.tensors) all.push_back(t.reshape(-1));
  return torch::cat(all);
}

// Runs `nodes` ring workers of `local` replicas (batch b each) and one single process (batch
// nodes*local*b); compares.
void expect_ring_equals_single(int nodes, int b, int accum, const std::vector<std::string>& ring_args,
                               const std::string& node0_log_has = "", int local = 1) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const int steps = 5;
  auto ps = start_ring(d, nodes, [&](int r) {
    auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), b, steps, accum);
    a.insert(a.end(), ring_args.begin(), ring_args.end());
    a.push_back("--dist.local_replicas=" + std::to_string(local));
    return a;
  });
  for (int r = 0; r < nodes; ++r) ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str("node" + std::to_string(r) + ".log"));
  test::Process single(worker_args(d, corpus, d.str("single"), nodes * local * b, steps, accum), {}, d.str("single.log"));
  ASSERT_EQ(single.wait(120), 0) << test::slurp(d.str("single.log"));

  auto w0 = final_weights(d.str("node0"), steps), ws = final_weights(d.str("single"), steps);
  for (int r = 1; r < nodes; ++r) EXPECT_TRUE(torch::equal(final_weights(d.str("node" + std::to_string(r)), steps), w0)) << r;
  EXPECT_TRUE(torch::allclose(w0, ws, 1e-4, 1e-5)) << "max diff " << (w0 - ws).abs().max().item<double>();
  // Every node's synchronization counters (sync.json): bytes on the wire whenever there is a ring,
  // and, with buckets reduced during backward, reductions that gradient hooks started.
  const bool overlap = std::find(ring_args.begin(), ring_args.end(), "--dist.overlap=false") == ring_args.end();
  int64_t sent = 0, received = 0;  // over the job: every byte a node sends, its ring neighbour receives
  for (int r = 0; r < nodes; ++r) {
    const auto c = nlohmann::json::parse(test::slurp(d.str("node" + std::to_string(r) + "/sync.json")));
    EXPECT_GT(c["wire_bytes"].get<int64_t>(), 0) << r << " " << c.dump();
    sent += c["wire_bytes"].get<int64_t>(), received += c["wire_bytes_received"].get<int64_t>();
    if (overlap) {
      EXPECT_EQ(c["reduced"].get<int64_t>(), steps * c["regions"].get<int64_t>()) << r << " " << c.dump();
      // Every bucket but possibly the step's last is launched from a hook during backward.
      EXPECT_GE(c["launched_early"].get<int64_t>(), c["reduced"].get<int64_t>() - steps) << r << " " << c.dump();
    } else {
      EXPECT_EQ(c["reduced"].get<int64_t>(), 0) << r << " " << c.dump();
    }
  }
  EXPECT_EQ(received, sent);
  if (!node0_log_has.empty()) {
    EXPECT_NE(test::slurp(d.str("node0.log")).find(node0_log_has), std::string::npos) << test::slurp(d.str("node0.log"));
  }
}
}  // namespace

// Whole-buffer reduction after backward.
TEST(RingTraining, TwoNodesEqualOneProcessWithDoubleBatch) { expect_ring_equals_single(2, 2, 1, {"--dist.overlap=false"}); }
// Buckets of a few KiB reduced during backward (many buckets even for this small model), with
// accumulation (only the last micro-batch's backward triggers them).
TEST(RingTraining, ThreeNodesBucketedOverlapWithAccumulationEqualOneProcess) {
  // Buckets are launched from gradient hooks during backward (all but possibly the last ones,
  // which complete with backward itself): sync.json counts them (checked for every overlapped run).
  expect_ring_equals_single(3, 2, 2, {"--dist.bucket_kb=16", "--dist.first_bucket_kb=4"});
}

// Whole-buffer reduction striped over two TCP streams per neighbour.
TEST(RingTraining, TwoStreamsPerNeighbourEqualOneProcess) {
  expect_ring_equals_single(2, 2, 1, {"--dist.overlap=false", "--dist.streams=2"});
}

// Two nodes of two CPU replicas each (threads, the stand-in for a node's GPUs): buckets go through
// the hierarchical all-reduce (reduce-scatter in the node, one ring lane per local replica,
// all-gather), pipelined across buckets (NodeAllreduce::submit/drain), with accumulation, and the
// four replicas match one process with batch 4b.
TEST(RingTraining, TwoNodesOfTwoLocalReplicasEqualOneProcess) {
  expect_ring_equals_single(2, 2, 2, {"--dist.bucket_kb=16", "--dist.first_bucket_kb=4"},
                            "2 local replica(s) (cpu)", /*local=*/2);
}
TEST(RingTraining, ThreeNodesOfTwoLocalReplicasWholeBufferEqualOneProcess) {
  expect_ring_equals_single(3, 1, 1, {"--dist.overlap=false"}, "", /*local=*/2);
}
// The simpler hierarchy: reduce to replica 0, which alone rings, broadcast.
TEST(RingTraining, TwoNodesOfThreeLocalReplicasRootHierarchyEqualOneProcess) {
  expect_ring_equals_single(2, 1, 1, {"--dist.hierarchy=root", "--dist.bucket_kb=16", "--dist.first_bucket_kb=4"}, "",
                            /*local=*/3);
}

// One node, no ring: its three local replicas average through the local group alone, bucket by
// bucket during backward.
TEST(LocalReplicas, ThreeReplicasOfOneNodeEqualOneProcess) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto a = worker_args(d, corpus, d.str("node"), 2, 5, 2);
  a.insert(a.end(), {"--dist.local_replicas=3", "--dist.bucket_kb=16", "--dist.first_bucket_kb=4"});
  test::Process node(a, {}, d.str("node.log"));
  ASSERT_EQ(node.wait(120), 0) << test::slurp(d.str("node.log"));
  test::Process single(worker_args(d, corpus, d.str("single"), 6, 5, 2), {}, d.str("single.log"));
  ASSERT_EQ(single.wait(120), 0) << test::slurp(d.str("single.log"));
  auto w = final_weights(d.str("node"), 5), ws = final_weights(d.str("single"), 5);
  EXPECT_TRUE(torch::allclose(w, ws, 1e-4, 1e-5)) << "max diff " << (w - ws).abs().max().item<double>();
  const auto c = nlohmann::json::parse(test::slurp(d.str("node/sync.json")));
  EXPECT_EQ(c["reduced"].get<int64_t>(), 5 * c["regions"].get<int64_t>()) << c.dump();
  EXPECT_GE(c["launched_early"].get<int64_t>(), c["reduced"].get<int64_t>() - 5) << c.dump();
  EXPECT_EQ(c["wire_bytes"].get<int64_t>(), 0) << c.dump();  // one node: nothing leaves it
  // Local replica 0 alone writes the node's outputs: one metrics line per step.
  std::istringstream lines(test::slurp(d.str("node/metrics.jsonl")));
  int n = 0;
  for (std::string l; std::getline(lines, l);) n += l.find("\"loss\"") != std::string::npos;
  EXPECT_EQ(n, 5);
}

// A replica that fails once built, before the first collective (SYNCOPATE_FAIL_AT=start:replica1:0,
// as an out-of-memory while building would): the replicas waiting in start()'s collective are
// released, and the node exits non-zero naming the cause, well within the collective's bound.
TEST(LocalReplicas, AReplicaFailingBeforeStartEndsTheNodeWithItsCause) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto a = worker_args(d, corpus, d.str("node"), 2, 5, 1);
  a.insert(a.end(), {"--dist.local_replicas=3", "--dist.local_timeout_s=60"});
  const auto t0 = std::chrono::steady_clock::now();
  test::Process node(a, {"SYNCOPATE_FAIL_AT=start:replica1:0"}, d.str("node.log"));
  EXPECT_EQ(node.wait(60), 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  const std::string log = test::slurp(d.str("node.log"));
  EXPECT_NE(log.find("injected failure before start"), std::string::npos) << log;
}

// Every local replica loads the checkpoint local replica 0 wrote: a resumed run of a node of two
// replicas ends bit-identical to the uninterrupted one.
TEST(LocalReplicas, ResumeFromACheckpointIsExact) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto run = [&](bool resume) {
    auto a = worker_args(d, corpus, d.str("node"), 2, 6, 1);
    // Dropout on (issue 16): each replica's masks follow from seed, rank and step, so a resume
    // draws what the uninterrupted run drew without saving generator state.
    a.insert(a.end(), {"--dist.local_replicas=2", "--checkpoint.every=2", "--model.dropout=0.1"});
    if (resume) a.push_back("--resume");
    test::Process p(a, {}, d.str("node.log"));
    ASSERT_EQ(p.wait(120), 0) << test::slurp(d.str("node.log"));
  };
  run(false);
  const at::Tensor uninterrupted = final_weights(d.str("node"), 6);
  fs::remove_all(d.str("node/checkpoints/step_000006"));
  std::ofstream(d.str("node/checkpoints/latest")) << "step_000004\n";
  run(true);
  EXPECT_NE(test::slurp(d.str("node.log")).find("resumed from"), std::string::npos) << test::slurp(d.str("node.log"));
  EXPECT_TRUE(torch::equal(final_weights(d.str("node"), 6), uninterrupted));
}

TEST(RingTraining, DifferentLocalReplicaCountsAreRefused) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto ps = start_ring(d, 2, [&](int r) {
    auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, 5, 1);
    a.push_back(r == 0 ? "--dist.local_replicas=2" : "--dist.local_replicas=1");
    return a;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ps[r]->wait(60), 1);
    const std::string log = test::slurp(d.str("node" + std::to_string(r) + ".log"));
    EXPECT_NE(log.find("node 1 opens 1 ring lanes, node 0 opens 2"), std::string::npos) << log;
  }
}

namespace {
// Kills node 1 of a 2-node ring once training is under way: node 0 (with `local` replicas) must
// stop within a bounded time, with a message naming node 1.
void expect_dead_node_stops_the_other(int local) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto ps = start_ring(d, 2, [&](int r) {
    auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, 100000, 1);
    a.insert(a.end(), {"--dist.timeout_s=3", "--dist.local_replicas=" + std::to_string(local)});
    return a;
  });
  // Wait until training is under way (node 0 has logged step 2), then kill node 1.
  ASSERT_TRUE(test::wait_for_step(d.str("node0"), 2, 120)) << test::slurp(d.str("node0.log"));
  ps[1]->kill_hard();
  const auto t0 = std::chrono::steady_clock::now();
  const int code = ps[0]->wait(30);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = test::slurp(d.str("node0.log"));
  EXPECT_EQ(code, 1) << log;
  EXPECT_LT(took, 25.0);  // bounded: dist.timeout_s=3 and the link's failure, with room for a loaded machine
  EXPECT_NE(log.find("node 1"), std::string::npos) << log;
}
}  // namespace

TEST(RingTraining, DeadNodeStopsTheOthersWithItsName) { expect_dead_node_stops_the_other(1); }
// Every local replica of the surviving node stops: their ring lanes fail, and the node's other
// replicas abort their collectives.
TEST(RingTraining, DeadNodeStopsNodesOfSeveralLocalReplicas) { expect_dead_node_stops_the_other(2); }

TEST(RingTraining, MismatchedConfigIsRefused) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto ps = start_ring(d, 2, [&](int r) {
    auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, 5, 1);
    if (r == 1) a.push_back("--model.n_layer=3");  // another model shape on node 1
    return a;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ps[r]->wait(60), 1);
    EXPECT_NE(test::slurp(d.str("node" + std::to_string(r) + ".log")).find("another model/config"), std::string::npos)
        << test::slurp(d.str("node" + std::to_string(r) + ".log"));
  }
}

// Nodes that would synchronize differently (here: node 1 read another advice, local SGD every 2
// steps) are refused at the rendezvous, the differing field written out, instead of hanging.
TEST(RingTraining, MismatchedSynchronizationIsRefusedNamingTheField) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto ps = start_ring(d, 2, [&](int r) {
    auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, 4, 1);
    if (r == 1) a.push_back("--dist.sync_every=2");
    return a;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ps[r]->wait(60), 1);
    const std::string log = test::slurp(d.str("node" + std::to_string(r) + ".log"));
    EXPECT_NE(log.find("another model/config"), std::string::npos) << log;
    if (r == 0) {
      EXPECT_NE(log.find("sync_every=2"), std::string::npos) << log;
    }
  }
}

// Taking a new advice's pick from the job's checkpoint (issue 29, worker/train/mode_switch.h): a
// ring job switches to local SGD (H=4) at its step-4 checkpoint; from its step-10 checkpoint, in
// the middle of a round (the nodes' inner weights differ; the later ones removed), to local SGD with
// H=3, also mid-round (10 % 3 = 1); at 12 back to the ring. Each switch is logged; AdamW's step count continues (the moments moved with the
// weights); local SGD sends bytes only at its rounds; after the mid-round switch the nodes start
// from the job's mean weights, so the next round ends with them identical (checked job-wide at
// every round end, and on the ring at every step).
TEST(RingTraining, SwitchingBetweenRingAndLocalSgdAtCheckpointsCarriesTheOptimizer) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto run = [&](int steps, const std::vector<std::string>& extra) {
    auto ps = start_ring(d, 2, [&](int r) {
      auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, steps, 1);
      a.insert(a.end(), {"--checkpoint.every=2", "--dist.check_every=1"});
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    });
    for (int r = 0; r < 2; ++r) ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str("node" + std::to_string(r) + ".log"));
  };
  auto opt_steps = [&](int node, int step) {
    auto st = load_safetensors(fmt::format("{}/checkpoints/step_{:06d}/optimizer.safetensors", d.str("node" + std::to_string(node)), step));
    return std::stoll(st.metadata.at("step"));
  };
  auto sent_after = [&](int node, int from) {
    std::istringstream lines(test::slurp(d.str("node" + std::to_string(node) + "/metrics.jsonl")));
    std::vector<int> sent;
    for (std::string l; std::getline(lines, l);) {
      if (l.find("\"loss\"") == std::string::npos) continue;
      const auto m = nlohmann::json::parse(l);
      if (m["step"].get<int>() > from && m["wire_bytes"].get<int64_t>() > 0) sent.push_back(m["step"].get<int>());
    }
    return sent;
  };
  run(4, {});
  run(12, {"--resume", "--dist.sync_every=4", "--dist.outer=nesterov"});
  std::string log = test::slurp(d.str("node0.log"));
  EXPECT_NE(log.find("switching from ring to ring local SGD (sync_every=4, outer=nesterov) at this checkpoint"),
            std::string::npos) << log;
  EXPECT_NE(log.find("AdamW's moments too"), std::string::npos) << log;
  EXPECT_EQ(opt_steps(0, 10), 10);  // counted on from the ring's 4 (a fresh optimizer would say 6)
  EXPECT_EQ(sent_after(1, 4), (std::vector<int>{8, 12}));
  EXPECT_FALSE(torch::equal(final_weights(d.str("node0"), 10), final_weights(d.str("node1"), 10)))
      << "mid-round the nodes' weights should differ: the next switch would not test the mean";
  for (int r = 0; r < 2; ++r) {  // the job resumes from its step-10 checkpoint, mid-round
    fs::remove_all(d.str("node" + std::to_string(r) + "/checkpoints/step_000012"));
    std::ofstream(d.str("node" + std::to_string(r) + "/checkpoints/latest")) << "step_000010\n";
  }
  run(12, {"--resume", "--dist.sync_every=3", "--dist.outer=nesterov"});
  log = test::slurp(d.str("node0.log"));
  EXPECT_NE(log.find("switching from ring local SGD (sync_every=4, outer=nesterov) to ring local SGD (sync_every=3"),
            std::string::npos) << log;
  EXPECT_TRUE(torch::equal(final_weights(d.str("node0"), 12), final_weights(d.str("node1"), 12)));  // round end
  run(14, {"--resume"});
  log = test::slurp(d.str("node0.log"));
  EXPECT_NE(log.find("switching from ring local SGD (sync_every=3, outer=nesterov) to ring"), std::string::npos) << log;
  EXPECT_EQ(opt_steps(1, 14), 14);
  EXPECT_TRUE(torch::equal(final_weights(d.str("node0"), 14), final_weights(d.str("node1"), 14)));
}

// Node 1 died before writing its step-6 checkpoint: on restart both nodes agree on step 4 (the
// newest both hold), train on from there and end exactly where the uninterrupted run ended.
TEST(RingTraining, RestartResumesFromTheNewestCheckpointEveryNodeHolds) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto run = [&](bool resume) {
    auto ps = start_ring(d, 2, [&](int r) {
      auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, 6, 1);
      a.push_back("--checkpoint.every=2");
      if (resume) a.push_back("--resume");
      return a;
    });
    for (int r = 0; r < 2; ++r) ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str("node" + std::to_string(r) + ".log"));
  };
  run(false);
  const at::Tensor uninterrupted = final_weights(d.str("node0"), 6);
  fs::remove_all(d.str("node1/checkpoints/step_000006"));
  std::ofstream(d.str("node1/checkpoints/latest")) << "step_000004\n";
  run(true);
  const std::string log0 = test::slurp(d.str("node0.log"));
  EXPECT_NE(log0.find("step 4; the newest checkpoint every node holds, local step 6 ignored"), std::string::npos) << log0;
  EXPECT_TRUE(torch::equal(final_weights(d.str("node0"), 6), uninterrupted));
  EXPECT_TRUE(torch::equal(final_weights(d.str("node1"), 6), uninterrupted));
  {  // metrics of steps 5 and 6 from the first run were dropped, not duplicated
    std::istringstream lines(test::slurp(d.str("node1/metrics.jsonl")));
    std::map<int, int> per_step;
    for (std::string l; std::getline(lines, l);)
      if (l.find("\"loss\"") != std::string::npos) ++per_step[std::stoi(l.substr(l.find("\"step\":") + 7))];
    EXPECT_EQ(per_step.size(), 6u);
    for (auto [step, n] : per_step) EXPECT_EQ(n, 1) << "step " << step;
  }

  // No step in common at all (node 1 was killed while writing its first checkpoint: a step_N.tmp
  // directory and a latest.tmp file are all it has): "no checkpoint" is step 0, held by every
  // node, so the job starts fresh with a line saying so, instead of failing at every restart,
  // and the unfinished writes are removed.
  fs::remove_all(d.str("node1/checkpoints"));
  fs::create_directories(d.str("node1/checkpoints/step_000003"));  // incomplete: does not count
  fs::create_directories(d.str("node1/checkpoints/step_000002.tmp"));
  std::ofstream(d.str("node1/checkpoints/latest.tmp.123.0")) << "step_000002\n";
  auto ps = start_ring(d, 2, [&](int r) {
    auto a = worker_args(d, corpus, d.str("node" + std::to_string(r)), 2, 6, 1);
    a.push_back("--checkpoint.every=2");
    if (r == 0) a.push_back("--resume");  // as launch_node.sh does: only where `latest` exists
    return a;
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ps[r]->wait(120), 0) << test::slurp(d.str("node" + std::to_string(r) + ".log"));
    const std::string log = test::slurp(d.str("node" + std::to_string(r) + ".log"));
    EXPECT_NE(log.find("no checkpoint step is held by every node (node 0: 2,4,6; node 1: none): every node starts fresh"),
              std::string::npos) << log;
  }
  EXPECT_FALSE(fs::exists(d.str("node1/checkpoints/step_000002.tmp")));
  EXPECT_FALSE(fs::exists(d.str("node1/checkpoints/latest.tmp.123.0")));
  EXPECT_TRUE(torch::equal(final_weights(d.str("node0"), 6), uninterrupted));  // a fresh start, the same run
  EXPECT_TRUE(torch::equal(final_weights(d.str("node1"), 6), uninterrupted));
}

// Issue 11: a ring node killed (SIGKILL, via SYNCOPATE_CRASH_AT) at each phase of its step-4
// checkpoint write: temp directory made, files half written, renamed but `latest` not updated,
// `latest` updated. Restarted as launch_node.sh does (--resume where `latest` exists), the job ends
// bit-identical to an uninterrupted run, and no unfinished write is left on disk.
// extra: further worker flags for both the reference and the crashed job.
void checkpoint_crash_recovers_exactly(const std::string& phase, const std::vector<std::string>& extra) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  auto job = [&](const std::string& prefix, const std::function<std::vector<std::string>(int)>& env_for) {
    return start_ring(d, 2, [&](int r) {
      const std::string out = d.str(prefix + std::to_string(r));
      auto a = worker_args(d, corpus, out, 2, 6, 1);
      a.push_back("--checkpoint.every=2");
      a.insert(a.end(), extra.begin(), extra.end());
      if (fs::exists(out + "/checkpoints/latest")) a.push_back("--resume");
      return a;
    }, env_for);
  };
  for (auto& p : job("ref", {})) ASSERT_EQ(p->wait(120), 0);
  const at::Tensor uninterrupted = final_weights(d.str("ref0"), 6);
  auto crashed = job("node", [&](int r) {
    return r == 0 ? std::vector<std::string>{"SYNCOPATE_CRASH_AT=checkpoint:" + phase + ":4"} : std::vector<std::string>{};
  });
  EXPECT_NE(crashed[0]->wait(120), 0) << "node 0 was to be killed while writing checkpoint 4";
  EXPECT_NE(crashed[1]->wait(120), 0) << "node 1 must fail when its neighbour dies";
  {  // the kill came where it was asked to: what node 0's disk holds proves the phase
    const std::string ck = d.str("node0/checkpoints/");
    const std::string latest = test::slurp(ck + "latest");
    const bool in_tmp = phase == "tmp_dir" || phase == "files";
    EXPECT_EQ(fs::exists(ck + "step_000004.tmp"), in_tmp);
    EXPECT_EQ(fs::exists(ck + "step_000004/meta.json"), !in_tmp);
    EXPECT_EQ(latest, phase == "latest" ? "step_000004\n" : "step_000002\n");
  }
  for (auto& p : job("node", {})) ASSERT_EQ(p->wait(120), 0) << test::slurp(d.str("node0.log")) << test::slurp(d.str("node1.log"));
  EXPECT_TRUE(torch::equal(final_weights(d.str("node0"), 6), uninterrupted));
  EXPECT_TRUE(torch::equal(final_weights(d.str("node1"), 6), uninterrupted));
  for (const auto& e : fs::directory_iterator(d.str("node0/checkpoints"))) {  // removed at start, or rewritten
    const std::string n = e.path().filename().string();
    EXPECT_EQ(n.find(".tmp"), std::string::npos) << n << " left behind";
  }
}

class CheckpointCrash : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(EveryPhase, CheckpointCrash, ::testing::Values("tmp_dir", "files", "rename", "latest"));
TEST_P(CheckpointCrash, RingJobRecoversExactly) { checkpoint_crash_recovers_exactly(GetParam(), {}); }

// The same with checkpoint.background: the kill comes on the writer thread while training goes on
// (0.3 s modelled steps, so that steps 5 and 6 are still running when it comes, and the run's last
// checkpoint does not abandon the write first).
class BackgroundCheckpointCrash : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(EveryPhase, BackgroundCheckpointCrash, ::testing::Values("tmp_dir", "files", "rename", "latest"));
TEST_P(BackgroundCheckpointCrash, RingJobRecoversExactly) {
  checkpoint_crash_recovers_exactly(GetParam(), {"--checkpoint.background=true", "--emulate.step_time_s=0.3"});
}

// Issue 15 (12): the Slurm mapping. Unset fields come from torchrun's variables first, then
// Slurm's (SLURM_PROCID -> node rank, SLURM_NTASKS -> nodes, the first host of
// SLURM_JOB_NODELIST -> master address), then defaults; explicit fields win over both.
TEST(DistConfig, SlurmAndTorchrunVariablesMapToTheJob) {
  const std::vector<std::string> names = {"MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "WORLD_SIZE", "RANK",
                                          "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_JOB_NODELIST", "SLURM_NTASKS",
                                          "SLURM_PROCID", "SLURM_NNODES", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const auto& n : names) {
    const char* v = std::getenv(n.c_str());
    saved[n] = v ? std::optional<std::string>(v) : std::nullopt;
    unsetenv(n.c_str());
  }
  struct Restore {
    std::map<std::string, std::optional<std::string>>& s;
    ~Restore() {
      for (auto& [n, v] : s) v ? setenv(n.c_str(), v->c_str(), 1) : unsetenv(n.c_str());
    }
  } restore{saved};
  auto resolved = [](DistConfig c) {
    resolve_from_environment(c);
    return c;
  };
  DistConfig ring;
  ring.mode = "ring";
  setenv("SLURM_JOB_NODELIST", "gpu[007-009,012],cpu1", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_PROCID", "2", 1);
  DistConfig c = resolved(ring);
  EXPECT_EQ(c.master_addr, "gpu007");
  EXPECT_EQ(c.nnodes, 4);
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.master_port, 29500);
  setenv("SLURM_JOB_NODELIST", "hostA,hostB", 1);
  EXPECT_EQ(resolved(ring).master_addr, "hostA");
  setenv("SLURM_JOB_NODELIST", "n[5]", 1);
  EXPECT_EQ(resolved(ring).master_addr, "n5");
  // torchrun's variables win over Slurm's; explicit fields over both.
  setenv("MASTER_ADDR", "10.0.0.9", 1);
  setenv("MASTER_PORT", "31000", 1);
  setenv("NNODES", "3", 1);
  setenv("NODE_RANK", "1", 1);
  c = resolved(ring);
  EXPECT_EQ(c.master_addr, "10.0.0.9");
  EXPECT_EQ(c.master_port, 31000);
  EXPECT_EQ(c.nnodes, 3);
  EXPECT_EQ(c.node_rank, 1);
  DistConfig explicit_rank = ring;
  explicit_rank.node_rank = 0;
  EXPECT_EQ(resolved(explicit_rank).node_rank, 0);
  // One replica ignores them all; a rank outside the job or a non-number is an error naming it.
  DistConfig none;
  EXPECT_EQ(resolved(none).nnodes, 1);
  setenv("NODE_RANK", "3", 1);
  EXPECT_NE(test::error_of([&] { resolved(ring); }).find("node rank 3 is outside 0..2"), std::string::npos);
  setenv("NODE_RANK", "one", 1);
  EXPECT_NE(test::error_of([&] { resolved(ring); }).find("NODE_RANK='one' is not an integer"), std::string::npos);
  for (const auto& n : names) unsetenv(n.c_str());

  // Issue 16 (5): launch layouts. torchrun --nnodes=2 --nproc-per-node=8, process 11 (host 1, GPU 3):
  // one process per GPU, each a node of the job with one replica on its local rank's GPU.
  setenv("WORLD_SIZE", "16", 1);
  setenv("RANK", "11", 1);
  setenv("LOCAL_RANK", "3", 1);
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  c = resolved(ring);
  EXPECT_EQ(c.launch, "gpu");
  EXPECT_EQ(c.nnodes, 16);
  EXPECT_EQ(c.node_rank, 11);
  EXPECT_EQ(c.device, 3);
  EXPECT_EQ(c.local_replicas, 1);
  EXPECT_EQ(resolved(c).device, 3);  // idempotent (join_job resolves again)
  // Issue 28 (5): it works, but 8 GPUs of one host then all-reduce over TCP: said plainly.
  EXPECT_NE(launch_layout_warning(c).find("8 processes on this host"), std::string::npos) << launch_layout_warning(c);
  EXPECT_NE(launch_layout_warning(c).find("--nproc-per-node=1"), std::string::npos);
  // The same launcher with dist.launch=node would make 8 processes drive all 8 GPUs: refused by name.
  DistConfig per_node = ring;
  per_node.launch = "node";
  EXPECT_NE(test::error_of([&] { resolved(per_node); }).find("--ntasks-per-node=1"), std::string::npos);
  DistConfig two = ring;
  two.local_replicas = 2;
  EXPECT_NE(test::error_of([&] { resolved(two); }).find("dist.launch=gpu with dist.local_replicas=2"), std::string::npos);
  // torchrun with one process per node: that process drives the node's GPUs.
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  c = resolved(ring);
  EXPECT_EQ(c.launch, "node");
  EXPECT_EQ(c.nnodes, 2);
  EXPECT_EQ(c.node_rank, 1);
  EXPECT_EQ(c.device, -1);
  EXPECT_EQ(launch_layout_warning(c), "");
  for (const auto& n : names) unsetenv(n.c_str());
  // srun --nodes=2 --ntasks-per-node=8: task 9 is GPU 1 of the second host (tasks are not nodes).
  setenv("SLURM_NTASKS", "16", 1);
  setenv("SLURM_NNODES", "2", 1);
  setenv("SLURM_PROCID", "9", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NTASKS_PER_NODE", "8(x2)", 1);
  c = resolved(ring);
  EXPECT_EQ(c.launch, "gpu");
  EXPECT_EQ(c.nnodes, 16);
  EXPECT_EQ(c.node_rank, 9);
  EXPECT_EQ(c.device, 1);
  unsetenv("SLURM_NTASKS_PER_NODE");  // older Slurm: tasks / nodes tells the same
  EXPECT_EQ(resolved(ring).launch, "gpu");
  // srun --ntasks-per-node=1: one process per node, as today.
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_LOCALID", "0", 1);
  c = resolved(ring);
  EXPECT_EQ(c.launch, "node");
  EXPECT_EQ(c.nnodes, 2);
  // One process per GPU asked for, but no launcher says which GPU: refused by name.
  unsetenv("SLURM_LOCALID");
  DistConfig per_gpu = ring;
  per_gpu.launch = "gpu";
  EXPECT_NE(test::error_of([&] { resolved(per_gpu); }).find("neither LOCAL_RANK (torchrun) nor SLURM_LOCALID"),
            std::string::npos);
  per_gpu.device = 5;  // or told explicitly
  EXPECT_EQ(resolved(per_gpu).device, 5);
}
