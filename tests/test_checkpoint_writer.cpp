// checkpoint.background: the background writer (worker/checkpoint/checkpoint_writer.h) against the
// synchronous write it replaces: the same files, a snapshot detached from the live state, one write
// in flight at a time, failures reported with their step.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/check.h"
#include "common/flat_adamw.h"
#include "common/safetensors.h"
#include "model/flat_parameters.h"
#include "model/gpt.h"
#include "tests/test_helpers.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/train/trainer.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {

// Every tensor of two safetensors files, equal by name and value.
void expect_same_tensors(const std::string& a, const std::string& b) {
  Safetensors x = load_safetensors(a), y = load_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << a << " vs " << b;
  for (auto& [name, t] : x.tensors) {
    ASSERT_TRUE(y.tensors.count(name)) << name << " missing in " << b;
    EXPECT_TRUE(torch::equal(t, y.tensors[name])) << name << ": " << a << " vs " << b;
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// The trainer with checkpoint.background writes, at every step, what the synchronous writer does,
// although training went on while each was written; and a resume from one ends bit for bit as the
// uninterrupted run.
TEST(CheckpointWriter, BackgroundCheckpointsHoldWhatTheTrainingThreadWouldHaveWritten) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 6;
  c.checkpoint.every = 2;
  c.checkpoint.keep = 10;
  torch::Tensor straight;
  {
    Trainer t(c, d.str("inline"), false, "", false);
    t.run();
    straight = t.flat().params.clone();
  }
  c.checkpoint.background = true;
  {
    Trainer t(c, d.str("bg"), false, "", false);
    t.run();
    EXPECT_TRUE(torch::equal(straight, t.flat().params));  // the writer does not touch training
  }
  for (int step : {2, 4, 6}) {
    const std::string a = checkpoint_dir(d.str("inline/checkpoints"), step), b = checkpoint_dir(d.str("bg/checkpoints"), step);
    expect_same_tensors(a + "/model.safetensors", b + "/model.safetensors");
    expect_same_tensors(a + "/optimizer.safetensors", b + "/optimizer.safetensors");
    const auto ma = nlohmann::json::parse(test::slurp(a + "/meta.json")), mb = nlohmann::json::parse(test::slurp(b + "/meta.json"));
    EXPECT_EQ(ma["step"], mb["step"]);
    EXPECT_EQ(ma["data"], mb["data"]);
  }
  EXPECT_EQ(latest_checkpoint(d.str("bg/checkpoints")), checkpoint_dir(d.str("bg/checkpoints"), 6));
  {  // resumed from the background writer's step 4 (the newer ones removed: a kill before they were written)
    fs::remove_all(checkpoint_dir(d.str("bg/checkpoints"), 6));
    { std::ofstream(d.str("bg/checkpoints/latest")) << "step_000004\n"; }
    Trainer t(c, d.str("bg"), true, "", false);
    EXPECT_EQ(t.step(), 4);
    t.run();
    EXPECT_TRUE(torch::equal(straight, t.flat().params)) << (straight - t.flat().params).abs().max().item<double>();
  }
}

// A detached snapshot owns its tensors: the live weights, moments and synchronization state changed
// after it was taken (the next steps) are not what gets written.
TEST(CheckpointWriter, ADetachedSnapshotIsNotChangedByTraining) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  GPT m(c.model);
  FlatParameters flat(*m);
  FlatAdamW opt(AdamWConfig{}, flat.numel(), {}, flat.params.options());
  opt.exp_avg().fill_(0.25);
  torch::Tensor round_start = torch::full({5}, 3.0);
  const torch::Tensor before = flat.params.clone();
  CheckpointContents snap =
      snapshot_checkpoint(7, *m, &opt, nlohmann::json{{"step", 7}}, {{"round_start", round_start}}, /*detach=*/true);
  torch::NoGradGuard no_grad;
  flat.params.add_(1.0);  // training goes on
  opt.exp_avg().fill_(9.0);
  round_start.fill_(-1.0);
  {
    CheckpointWriter w(d.str("ck"), 3, 0.0);
    w.submit(std::move(snap));
    EXPECT_GE(w.wait(), 0.0);
    EXPECT_EQ(w.last_written(), checkpoint_dir(d.str("ck"), 7));
  }
  flat.params.copy_(torch::zeros_like(flat.params));
  torch::Tensor restored = torch::zeros({5});
  load_checkpoint(latest_checkpoint(d.str("ck")), *m, &opt, {{"round_start", restored}});
  EXPECT_TRUE(torch::equal(flat.params, before));
  EXPECT_TRUE(torch::equal(opt.exp_avg(), torch::full_like(opt.exp_avg(), 0.25)));
  EXPECT_TRUE(torch::equal(restored, torch::full({5}, 3.0)));
}

// One write in flight: wait() waits for it (its held write time), and a checkpoint is durable only at
// the end of its modelled write (it is renamed into place and named by `latest` after the hold).
TEST(CheckpointWriter, AWriteCommitsAtTheEndOfItsHoldAndWaitWaitsForIt) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  GPT m(c.model);
  CheckpointWriter w(d.str("ck"), 5, /*hold_s=*/0.6);
  const auto t0 = std::chrono::steady_clock::now();
  w.submit(snapshot_checkpoint(1, *m, nullptr, {{"step", 1}}, {}, true));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(list_checkpoints(d.str("ck")).empty());  // written, not committed: a kill now resumes from before it
  EXPECT_EQ(latest_checkpoint(d.str("ck")), "");
  EXPECT_GT(w.wait(), 0.2);  // the rest of the 0.6 s hold
  EXPECT_GT(seconds_since(t0), 0.55);
  w.submit(snapshot_checkpoint(2, *m, nullptr, {{"step", 2}}, {}, true));
  w.wait();
  EXPECT_EQ(list_checkpoints(d.str("ck")), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(latest_checkpoint(d.str("ck")), checkpoint_dir(d.str("ck"), 2));
}

// A write that fails in the background (the checkpoint root is a file) is reported by the next
// wait() with its step and what to do, once.
TEST(CheckpointWriter, AFailedBackgroundWriteIsReportedWithItsStep) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  GPT m(c.model);
  { std::ofstream(d.str("not_a_dir")) << "x"; }
  CheckpointWriter w(d.str("not_a_dir"), 3, 0.0);
  w.submit(snapshot_checkpoint(3, *m, nullptr, {{"step", 3}}, {}, true));
  try {
    w.wait();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("checkpoint step 3"), std::string::npos) << what;
    EXPECT_NE(what.find("--resume"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(w.wait());  // reported once
}

// A SIGTERM while a background write is held: the node lets that write commit, then writes its last
// checkpoint (a restarting ring resumes from a step every node holds: the others completed the
// write), exits 0, and `latest` names the step it stopped after, with no temporary directory left.
TEST(CheckpointWriter, APreemptedNodeCommitsTheWriteInFlightThenWritesItsLast) {
  test::TempDir d;
  const std::string corpus = test::write_tiny_corpus(d);
  const std::string bin = test::bin_dir();
  std::vector<std::string> a = {bin + "/syncopate-worker", "--out", d.str("w"), "--model.n_embd=32", "--model.n_head=2",
                                "--model.block_size=32", "--train.threads=1", "--eval.every=0", "--eval.batches=1",
                                "--eval.sample_tokens=0", "--data.corpus=" + corpus, "--data.cache_dir=" + d.str("cache"),
                                "--train.steps=2000", "--train.batch_size=2", "--emulate.step_time_s=0.05",
                                "--checkpoint.every=10", "--checkpoint.background=true", "--emulate.checkpoint_s=2",
                                "--train.preempt_grace_s=60"};
  test::Process w(a, {}, d.str("w.log"));
  ASSERT_TRUE(test::wait_for_step(d.str("w"), 12, 120)) << test::slurp(d.str("w.log"));  // step 10's write is held
  ::kill(w.pid(), SIGTERM);
  EXPECT_EQ(w.wait(60), 0) << test::slurp(d.str("w.log"));
  const std::string log = test::slurp(d.str("w.log"));
  const std::vector<int64_t> held = list_checkpoints(d.str("w/checkpoints"));
  ASSERT_EQ(held.size(), 2u) << log;
  EXPECT_EQ(held[0], 10) << log;  // committed, not abandoned
  EXPECT_GE(held[1], 12);
  EXPECT_LT(held[1], 20) << log;  // it stopped at the next step boundary
  EXPECT_EQ(latest_checkpoint(d.str("w/checkpoints")), checkpoint_dir(d.str("w/checkpoints"), held[1]));
  for (const auto& e : fs::directory_iterator(d.str("w/checkpoints")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}
