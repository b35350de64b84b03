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
#include "worker/checkpoint.h"
#include "worker/flat_parameters.h"
#include "worker/trainer.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}
}  // namespace

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
  auto m = read_metrics(d.str("run/metrics.jsonl"));
  ASSERT_FALSE(m.empty());
  for (const char* k : {"step", "time_s", "loss", "lr", "tokens", "tokens_per_s"}) EXPECT_TRUE(m.front().contains(k)) << k;
  EXPECT_TRUE(m.back().contains("val_loss"));  // evaluation at the last step
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000150/model.safetensors")));
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
  {
    Trainer t(c, d.str("b"), true, "", false);
    EXPECT_EQ(t.step(), 4);
    t.run();
    resumed = t.flat().params.clone();
  }
  EXPECT_TRUE(torch::equal(straight, resumed)) << (straight - resumed).abs().max().item<double>();
  // The resumed run appended to the metrics of the first part.
  EXPECT_EQ(read_metrics(d.str("b/metrics.jsonl")).back()["step"], 8);
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
    load_checkpoint(latest_checkpoint(d.str("run/checkpoints")), *m, opt);
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
