// The real binaries, as a user runs them: exit codes and messages on bad input, train then generate.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/test_helpers.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
const std::string kWorker = std::string(SYNCOPATE_BIN_DIR) + "/syncopate-worker";
const std::string kGenerate = std::string(SYNCOPATE_BIN_DIR) + "/syncopate-generate";

std::string tiny_args(const test::TempDir& d) {
  return " --model.n_embd=32 --model.n_head=2 --model.block_size=32 --train.batch_size=4 --train.threads=1"
         " --schedule.warmup_steps=1 --eval.batches=1 --eval.sample_tokens=4 --data.corpus=" +
         test::write_tiny_corpus(d) + " --data.cache_dir=" + d.str("cache");
}
}  // namespace

TEST(WorkerCli, MalformedConfigExitsWithLineNumber) {
  test::TempDir d;
  std::ofstream(d.str("bad.toml")) << "[train]\nsteps = \"many\n";
  auto r = test::run_command(kWorker + " --config " + d.str("bad.toml"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.toml:2"), std::string::npos) << r.output;
}

TEST(WorkerCli, BadValueNamesFieldAndRange) {
  auto r = test::run_command(kWorker + " --train.steps=0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("train.steps"), std::string::npos) << r.output;
  r = test::run_command(kWorker + " --bogus");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("unknown argument '--bogus'"), std::string::npos) << r.output;
}

TEST(WorkerCli, HelpListsFields) {
  auto r = test::run_command(kWorker + " --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--optim.weight_decay="), std::string::npos);
}

TEST(WorkerCli, TrainResumeThenGenerate) {
  test::TempDir d;
  auto r = test::run_command(kWorker + tiny_args(d) + " --train.steps=4 --checkpoint.every=2 --out " + d.str("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000004/meta.json")));
  r = test::run_command(kWorker + tiny_args(d) + " --train.steps=6 --resume --out " + d.str("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000006")));

  r = test::run_command(kGenerate + " --checkpoint " + d.str("run/checkpoints") + " --prompt-ids 100,101 --max-new-tokens 5 --greedy --print-ids");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("100,101,", 0), 0u) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), ','), 6) << r.output;
  r = test::run_command(kGenerate + " --weights " + d.str("run/checkpoints/step_000006/model.safetensors") +
                        " --prompt 'def ' --max-new-tokens 8 --temperature 0.8 --top-k 5 --seed 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("def ", 0), 0u) << r.output;
}

TEST(GenerateCli, TruncatedWeightsAreAClearError) {
  test::TempDir d;
  std::ofstream(d.str("w.safetensors")) << "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":";
  auto r = test::run_command(kGenerate + " --weights " + d.str("w.safetensors"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("w.safetensors"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate"), std::string::npos) << r.output;  // no crash
}
