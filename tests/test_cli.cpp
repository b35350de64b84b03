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
const std::string kServer = std::string(SYNCOPATE_BIN_DIR) + "/syncopate-server";

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

// Issue 32: one job.toml holds a job. The worker skips the server's [ps] / [server] sections, the
// server reads them and skips every section of the worker's (its whole --print-config, so a
// section added to the worker and not named in the server fails here). On the command line the
// other program's flag is named with its owner, not called a typo; a real typo still is.
TEST(JobFile, WorkerAndServerShareOneFile) {
  test::TempDir d;
  auto r = test::run_command(kWorker + " --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(d.str("job.toml")) << r.output << "[ps]\nconsistency = \"asp\"\nstaleness_bound = 7\n[server]\nthreads = 3\n";
  r = test::run_command(kServer + " --config " + d.str("job.toml") + " --print-config 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("consistency = 'asp'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("staleness_bound = 7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("threads = 3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[train]"), std::string::npos) << r.output;
  r = test::run_command(kWorker + " --config " + d.str("job.toml") + " --train.steps=50 --print-config 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("steps = 50"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[ps]"), std::string::npos) << r.output;

  r = test::run_command(kWorker + " --ps.consistency=asp 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--ps.consistency is a setting of syncopate-server"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("spelling"), std::string::npos) << r.output;
  r = test::run_command(kServer + " --train.steps=3 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--train.steps is a setting of syncopate-worker"), std::string::npos) << r.output;
  std::ofstream(d.str("typo.toml")) << "[pss]\nconsistency = \"asp\"\n";
  for (const auto& bin : {kWorker, kServer}) {
    r = test::run_command(bin + " --config " + d.str("typo.toml") + " --print-config 2>&1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("typo.toml:1: unknown config section [pss]"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("check the spelling"), std::string::npos) << r.output;
  }
}

// Issue 32: --print-config shows the node count, rank and master address this process would use,
// and where each came from; the TOML stays loadable (the values are comments).
TEST(WorkerCli, PrintConfigShowsTheResolvedJob) {
  test::TempDir d;
  const std::string env = "env -u WORLD_SIZE -u RANK -u SLURM_NTASKS -u SLURM_PROCID -u SLURM_JOB_NODELIST -u MASTER_PORT "
                          "-u LOCAL_WORLD_SIZE -u SLURM_NTASKS_PER_NODE NNODES=3 NODE_RANK=2 MASTER_ADDR=10.1.2.3 ";
  auto r = test::run_command(env + kWorker + " --dist.mode=ring --print-config 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nnodes = 0  # this run: 3 (from $NNODES)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("node_rank = -1  # this run: 2 (from $NODE_RANK)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# this run: \"10.1.2.3\" (from $MASTER_ADDR)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("master_port = 0  # this run: 29500 (from the default)"), std::string::npos) << r.output;
  r = test::run_command(env + kWorker + " --dist.mode=ring --dist.nnodes=4 --print-config 2>&1");
  EXPECT_NE(r.output.find("nnodes = 4  # this run: 4 (from dist.nnodes)"), std::string::npos) << r.output;
  std::ofstream(d.str("printed.toml")) << r.output;
  r = test::run_command(kWorker + " --config " + d.str("printed.toml") + " --print-config 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_command(env + kWorker + " --dist.mode=ring --dist.node_rank=5 --print-config 2>&1");
  EXPECT_NE(r.output.find("# the environment does not resolve here: node rank 5 is outside 0..2"), std::string::npos) << r.output;
}

// Issue 32: the server's --help names its other commands and does not call an empty key "no
// encryption" (a token turns CURVE on by default); neither does the worker's.
TEST(ServerCli, HelpNamesStatusKeysAndEncryption) {
  auto r = test::run_command(kServer + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* s : {"--status", "--generate-curve-keys", "--config FILE", "--print-config", "--server.curve_key_file"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  EXPECT_EQ(r.output.find("no encryption"), std::string::npos) << r.output;
  r = test::run_command(kWorker + " --help");
  EXPECT_EQ(r.output.find("no encryption"), std::string::npos) << r.output;
}

// Issue 32: a run into a directory that holds one (checkpoints/latest) without --resume is refused
// (exit 2, nothing touched) and says what to do; --force replaces it; --resume and --force together
// are refused.
TEST(WorkerCli, AnExistingRunIsRefusedUnlessResumedOrForced) {
  test::TempDir d;
  const std::string run = " --checkpoint.every=0 --eval.every=0 --out " + d.str("run");
  auto r = test::run_command(kWorker + tiny_args(d) + " --train.steps=3" + run + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string first = test::slurp(d.str("run/metrics.jsonl"));
  r = test::run_command(kWorker + tiny_args(d) + " --train.steps=2" + run + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("already holds a run"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--resume"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  EXPECT_EQ(test::slurp(d.str("run/metrics.jsonl")), first);
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000003")));
  r = test::run_command(kWorker + tiny_args(d) + " --train.steps=2 --resume --force" + run + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--resume and --force together"), std::string::npos) << r.output;
  r = test::run_command(kWorker + tiny_args(d) + " --train.steps=2 --force" + run + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string second = test::slurp(d.str("run/metrics.jsonl"));
  EXPECT_NE(second.find("\"step\":2,"), std::string::npos) << second;
  EXPECT_EQ(second.find("\"step\":3,"), std::string::npos) << second;  // the first run's metrics are gone
  EXPECT_FALSE(fs::exists(d.str("run/checkpoints/step_000003")));
  EXPECT_TRUE(fs::exists(d.str("run/checkpoints/step_000002")));
}

TEST(GenerateCli, TruncatedWeightsAreAClearError) {
  test::TempDir d;
  std::ofstream(d.str("w.safetensors")) << "\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":";
  auto r = test::run_command(kGenerate + " --weights " + d.str("w.safetensors"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("w.safetensors"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("terminate"), std::string::npos) << r.output;  // no crash
}
