// The training loop end to end, in process: learning, exact resume, checkpoints, bad checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/check.h"
#include "common/flat_adamw.h"
#include "model/gpt.h"
#include "tests/test_helpers.h"
#include "worker/checkpoint/checkpoint.h"
#include "model/flat_parameters.h"
#include "worker/train/precision.h"
#include "worker/train/trainer.h"

using namespace syncopate;
namespace fs = std::filesystem;


TEST(Trainer, TinyModelOverfitsTinyText) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 150;
  c.optim.lr = 3e-3;
  c.schedule.min_lr = 3e-4;
  c.schedule.warmup_steps = 10;
  c.model.n_embd = 64;
  c.model.n_head = 4;
  Trainer t(c, d.str("run"), false, "", false);
  const double before = t.evaluate();
  t.run();
  const double after = t.evaluate();
  EXPECT_GT(before, 5.0);
  EXPECT_LT(after, 1.0) << "val loss before " << before;
  auto m = test::read_jsonl(d.str("run/metrics.jsonl"));
  ASSERT_FALSE(m.empty());
  for (const char* k : {"step", "time_s", "loss", "lr", "tokens", "tokens_per_s"}) EXPECT_TRUE(m.front().contains(k)) << k;
  EXPECT_TRUE(m.back().contains("val_loss"));  // evaluation at the last step
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000150/model.safetensors")));
}

namespace {
// Trains `c` into `out` (under d) and returns its evaluation records, in order.
std::vector<nlohmann::json> evaluations_of_run(const RunConfig& c, const std::string& out) {
  Trainer t(c, out, false, "", false);
  t.run();
  std::vector<nlohmann::json> evals;
  for (auto& m : test::read_jsonl(out + "/metrics.jsonl"))
    if (m.contains("val_loss")) evals.push_back(m);
  return evals;
}
}  // namespace

// Issue 25: one held-out set for every seed. Two runs of different training seeds are scored on the
// same windows (the same digest and token count in every evaluation record), a different
// eval.val_seed picks other windows, and a set larger than the validation split is refused by name.
TEST(Trainer, HeldOutSetIsTheSameForEverySeedAndNamedInEveryRecord) {
  test::TempDir d;
  auto evals_of = [&](int64_t seed, int64_t val_seed, bool defer, const std::string& out) {
    RunConfig c = test::tiny_run_config(d);
    c.train.steps = 4;
    c.train.seed = seed;
    c.eval.every = 2;
    c.eval.val_windows = 6;
    c.eval.val_seed = val_seed;
    c.eval.defer = defer;
    return evaluations_of_run(c, d.str(out));
  };
  const auto a = evals_of(1, 1, false, "a"), b = evals_of(2, 1, true, "b"), c = evals_of(1, 2, false, "c");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (const auto& e : a) {
    EXPECT_EQ(e["val_tokens"], 6 * test::tiny_run_config(d).model.block_size) << e.dump();
    EXPECT_EQ(e["val_set"], a.front()["val_set"]) << e.dump();
    EXPECT_EQ(e["eval_of"], "replica") << e.dump();
  }
  for (const auto& e : b) {
    EXPECT_EQ(e["val_set"], a.front()["val_set"]) << "another training seed, the same held-out windows: " << e.dump();
    EXPECT_TRUE(e.value("deferred", false)) << e.dump();
  }
  EXPECT_NE(c.front()["val_set"], a.front()["val_set"]);
  EXPECT_NE(a.front()["val_loss"], b.front()["val_loss"]);  // other weights, same set: other losses
  RunConfig big = test::tiny_run_config(d);
  big.eval.val_windows = 1 << 20;
  const std::string err = test::error_of([&] { Trainer t(big, d.str("big"), false, "", false); });
  EXPECT_NE(err.find("eval.val_windows=1048576"), std::string::npos) << err;
  EXPECT_NE(err.find("lower eval.val_windows"), std::string::npos) << err;
}

// eval.every_tokens: evaluations where the job's tokens cross multiples of it (and at the end),
// each record with the job's tokens (alone: the node's own).
TEST(Trainer, EvaluatesAtMultiplesOfTheJobsTokens) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 7;
  c.eval.every = 1;  // ignored once every_tokens is set
  const int64_t per_step = c.train.batch_size * c.train.grad_accum * c.model.block_size;
  c.eval.every_tokens = 3 * per_step - 1;  // crossed at steps 3, 6 (and 7 is the end)
  Trainer t(c, d.str("run"), false, "", false);
  t.run();
  std::vector<int64_t> steps;
  for (auto& m : test::read_jsonl(d.str("run/metrics.jsonl")))
    if (m.contains("val_loss")) {
      steps.push_back(m["step"].get<int64_t>());
      EXPECT_EQ(m["global_tokens"], m["tokens"]) << m.dump();
    }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 6, 7}));
}

// eval.defer scores the same weights as an evaluation on the spot: the same losses, bit for bit,
// and the snapshots cost the training clock (nearly) nothing. Beyond eval.defer_memory_mb they are
// spilled to OUT/deferred/ and read back: the same losses again, and no file is left behind.
TEST(Trainer, DeferredEvaluationScoresTheSameWeightsAsOnTheSpot) {
  test::TempDir d;
  auto run = [&](bool defer, const std::string& out, int64_t memory_mb = 2048) {
    RunConfig c = test::tiny_run_config(d);
    c.train.steps = 6;
    c.eval.every = 2;
    c.eval.defer = defer;
    c.eval.defer_memory_mb = memory_mb;
    std::vector<double> v;
    for (const auto& m : evaluations_of_run(c, d.str(out))) v.push_back(m["val_loss"].get<double>());
    return v;
  };
  const auto now = run(false, "now"), later = run(true, "later"), spilled = run(true, "spilled", 0);
  ASSERT_EQ(now.size(), 3u);
  EXPECT_EQ(now, later);
  EXPECT_EQ(now, spilled);
  EXPECT_FALSE(std::filesystem::exists(d.str("spilled/deferred"))) << "spilled snapshots left behind";
}

TEST(Trainer, ResumeIsBitIdentical) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.model.dropout = 0.1;  // exercises the RNG state in the checkpoint
  c.train.steps = 8;
  c.train.grad_accum = 2;
  c.checkpoint.every = 4;
  torch::Tensor straight, resumed;
  {
    Trainer t(c, d.str("a"), false, "", false);
    t.run();
    straight = t.flat().params.clone();
  }
  {
    Trainer t(c, d.str("b"), false, "", false);
    t.run(/*stop_at=*/4);  // "crash" after the checkpoint at step 4
  }
  {  // the data position travels in the checkpoint: 4 steps x 2 micro-batches x batch 4
    const auto meta = nlohmann::json::parse(test::slurp(d.str("b/checkpoints/step_000004/meta.json")));
    EXPECT_EQ(meta["data"]["position"], 4 * 2 * 4);
    EXPECT_EQ(meta["data"]["epoch"], 0);
  }
  {
    Trainer t(c, d.str("b"), true, "", false);
    EXPECT_EQ(t.step(), 4);
    t.run();
    resumed = t.flat().params.clone();
  }
  EXPECT_TRUE(torch::equal(straight, resumed)) << (straight - resumed).abs().max().item<double>();
  // The resumed run appended to the metrics of the first part.
  EXPECT_EQ(test::read_jsonl(d.str("b/metrics.jsonl")).back()["step"], 8);
}

TEST(Checkpoint, KeepsNewestAndPointsLatestAtIt) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 5;
  c.checkpoint.every = 1;
  c.checkpoint.keep = 2;
  Trainer t(c, d.str("run"), false, "", false);
  t.run();
  std::vector<std::string> dirs;
  for (auto& e : fs::directory_iterator(d.str("run/checkpoints")))
    if (e.is_directory()) dirs.push_back(e.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<std::string>{"step_000004", "step_000005"}));
  EXPECT_EQ(latest_checkpoint(d.str("run/checkpoints")), d.str("run/checkpoints/step_000005"));
}

TEST(Checkpoint, OtherModelShapeIsRejectedAndChangesNothing) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 2;
  { Trainer(c, d.str("run"), false, "", false).run(); }
  GPTConfig other = c.model;
  other.n_embd = 48;
  other.n_head = 3;
  GPT m(other);
  FlatParameters flat(*m);
  FlatAdamW opt(AdamWConfig{}, flat.numel(), {}, flat.params.options());
  auto before = flat.params.clone();
  try {
    load_checkpoint(latest_checkpoint(d.str("run/checkpoints")), *m, &opt);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(before, flat.params));
}

TEST(Checkpoint, TruncatedCheckpointIsAClearError) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 2;
  { Trainer(c, d.str("run"), false, "", false).run(); }
  const std::string f = d.str("run/checkpoints/step_000002/optimizer.safetensors");
  fs::resize_file(f, fs::file_size(f) / 2);
  try {
    Trainer t(c, d.str("run"), true, "", false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.safetensors"), std::string::npos) << e.what();
  }
  // A missing checkpoint on --resume is an error too, not a silent fresh start.
  EXPECT_THROW(Trainer(c, d.str("empty"), true, "", false), Error);
}

// Loose JSON + a GPT-2 BPE vocabulary (trained here, as tests never download) straight into the
// trainer: tokenized on first use into the cache, trained on, sampled as text.
TEST(Trainer, TrainsOnJsonLinesWithGpt2Bpe) {
  test::TempDir d;
  {
    std::ofstream corpus(d.str("corpus.txt")), jsonl(d.str("docs.jsonl"));
    for (int i = 0; i < 400; ++i) {
      const std::string text = fmt::format("Document {}: the quick brown fox didn't jump over {} lazy dogs.", i, i % 13);
      corpus << text << "\n";
      jsonl << nlohmann::json{{"id", i}, {"text", text}}.dump() << "\n";
    }
  }
  const auto r = test::run_command(fmt::format("{} {}/tests/bpe_reference.py train {} {} 400 2>&1", SYNCOPATE_PYTHON,
                                               SYNCOPATE_SOURCE_DIR, d.str("corpus.txt"), d.str("vocab")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  RunConfig c = test::tiny_run_config(d);
  c.data.corpus = d.str("docs.jsonl");
  c.data.tokenizer = "gpt2-bpe";
  c.data.vocab_file = d.str("vocab/vocab.json");
  c.data.merge_file = d.str("vocab/merges.txt");
  const int64_t vocab = static_cast<int64_t>(nlohmann::json::parse(test::slurp(c.data.vocab_file)).size());
  c.model.vocab_size = vocab - 1;  // smaller than the vocabulary: refused with the size to use
  const std::string msg = test::error_of([&] { Trainer(c, d.str("small"), false, "", false); });
  EXPECT_NE(msg.find(fmt::format("set --model.vocab_size={}", vocab)), std::string::npos) << msg;
  c.model.vocab_size = vocab;
  c.train.steps = 30;
  c.optim.lr = 3e-3;
  c.eval.sample_prompt = "the quick";
  Trainer t(c, d.str("run"), false, "", false);
  const double before = t.evaluate();
  t.run();
  EXPECT_LT(t.evaluate(), before - 1.0);
  const std::string sample = t.sample_text();
  EXPECT_EQ(sample.rfind("the quick", 0), 0u) << sample;  // decoded text that starts with the prompt
  EXPECT_GT(sample.size(), std::string("the quick").size());
}

// The finite-update guard (issue 11): a step whose averaged gradient is non-finite, or above
// train.skip_grad_norm, updates nothing; it is logged and counted; train.max_skipped_steps in a
// row end the run with an error that says what happened.
TEST(Trainer, SkippedStepsChangeNothingAndTooManyInARowEndTheRun) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 4;
  c.schedule.warmup_steps = 0;
  c.train.skip_grad_norm = 1e-12;  // every gradient is "too large"
  c.train.max_skipped_steps = 100;
  {
    Trainer t(c, d.str("skip"), false, "", false);
    const torch::Tensor before = t.flat().params.clone();
    t.run();
    EXPECT_TRUE(torch::equal(t.flat().params, before));
    auto m = test::read_jsonl(d.str("skip/metrics.jsonl"));
    int64_t skipped = -1;
    for (const auto& r : m)
      if (r.contains("skipped_steps")) skipped = r["skipped_steps"];
    EXPECT_EQ(skipped, 4);
  }
  c.train.max_skipped_steps = 3;
  Trainer t(c, d.str("stop"), false, "", false);
  try {
    t.run();
    ADD_FAILURE() << "three skipped steps in a row did not end the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 steps in a row had a non-finite or oversized gradient"), std::string::npos)
        << e.what();
  }
  // A diverged run (non-finite gradients) is skipped the same way, without any bound set.
  c.train.skip_grad_norm = 0;
  c.optim.lr = 1e30;
  c.optim.grad_clip = 0;
  c.train.steps = 8;
  Trainer div(c, d.str("diverged"), false, "", false);
  EXPECT_THROW(div.run(), Error);
  EXPECT_TRUE(torch::isfinite(div.flat().params).all().item<bool>()) << "non-finite weights after the guard";
}

// Issue 16 (6): bf16 only where the GPU has bf16 tensor cores (compute capability 8.0+); below it,
// or unknown, fp32 with a line that says why; fp32 and CPU never autocast.
TEST(Precision, Bf16OnlyFromComputeCapability80) {
  EXPECT_TRUE(choose_precision("auto", true, 90).bf16);   // H100
  EXPECT_TRUE(choose_precision("bf16", true, 80).bf16);   // A100
  EXPECT_TRUE(choose_precision("auto", true, 90).note.empty());
  const PrecisionChoice v100 = choose_precision("auto", true, 70);
  EXPECT_FALSE(v100.bf16);
  EXPECT_NE(v100.note.find("compute capability is 7.0"), std::string::npos) << v100.note;
  EXPECT_NE(v100.note.find("fp32"), std::string::npos) << v100.note;
  EXPECT_FALSE(choose_precision("bf16", true, 75).bf16);  // T4: asked for, not available
  EXPECT_NE(choose_precision("bf16", true, -1).note.find("unknown"), std::string::npos);
  EXPECT_FALSE(choose_precision("fp32", true, 90).bf16);
  EXPECT_TRUE(choose_precision("fp32", true, 70).note.empty());
  EXPECT_FALSE(choose_precision("auto", false, -1).bf16);  // CPU
  EXPECT_TRUE(choose_precision("auto", false, -1).note.empty());
}

// emulate.checkpoint_s: every checkpoint write holds the node until the modelled write time has
// passed, on the job's clock: after two checkpoints of 0.3 s the third step is logged at least
// 0.6 s into the run (the tiny model's real writes take milliseconds). A lower bound: it cannot
// pass without the hold, and no machine makes a sleep shorter.
TEST(Trainer, ACheckpointTakesAtLeastItsModelledWriteTime) {
  test::TempDir d;
  RunConfig c = test::tiny_run_config(d);
  c.train.steps = 3;
  c.checkpoint.every = 1;
  c.emulate.checkpoint_s = 0.3;
  Trainer t(c, d.str("run"), false, "", false);
  t.run();
  double at_step3 = -1;
  for (auto& m : test::read_jsonl(d.str("run/metrics.jsonl")))
    if (m.contains("loss") && m["step"] == 3) at_step3 = m["time_s"].get<double>();
  EXPECT_GE(at_step3, 0.6);
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000003/model.safetensors")));
}
