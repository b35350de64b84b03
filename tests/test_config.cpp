// Config loading, overrides and validation: bad values are rejected with the field's name.
#include <gtest/gtest.h>

#include <fstream>

#include "common/check.h"
#include "common/config_schema.h"
#include "tests/test_helpers.h"
#include "worker/train/run_config.h"

using namespace syncopate;

namespace {
struct Fixture {
  RunConfig cfg;
  ConfigSchema schema;
  Fixture() { cfg.bind(schema); }
};

}  // namespace

TEST(Config, DefaultsAndOverrides) {
  Fixture f;
  EXPECT_EQ(f.cfg.train.steps, 2000);
  EXPECT_DOUBLE_EQ(f.cfg.optim.lr, 2e-3);
  f.schema.apply_args({"--train.steps=20", "--optim.lr", "3e-4", "--train.device=cpu", "--model.qkv_bias=false"});
  EXPECT_EQ(f.cfg.train.steps, 20);
  EXPECT_DOUBLE_EQ(f.cfg.optim.lr, 3e-4);
  EXPECT_EQ(f.cfg.train.device, "cpu");
  EXPECT_FALSE(f.cfg.model.qkv_bias);
}

TEST(Config, PresetResetsModelAndFieldsAfterItWin) {
  Fixture f;
  f.schema.apply_args({"--model.n_layer=3", "--model.preset=gpt2"});  // preset applied first
  EXPECT_EQ(f.cfg.model.n_embd, 768);
  EXPECT_EQ(f.cfg.model.vocab_size, 50257);
  EXPECT_EQ(f.cfg.model.padded_vocab(), 50304);
  EXPECT_EQ(f.cfg.model.n_layer, 3);
}

TEST(Config, TomlFileRoundTrip) {
  test::TempDir d;
  Fixture a;
  a.schema.apply_args({"--train.steps=7", "--eval.sample_prompt=he said \"hi\"\\n"});
  std::ofstream(d.str("c.toml")) << a.schema.to_toml();
  Fixture b;
  b.schema.load_file(d.str("c.toml"));
  EXPECT_EQ(b.cfg.train.steps, 7);
  EXPECT_EQ(b.cfg.eval.sample_prompt, a.cfg.eval.sample_prompt);
  EXPECT_EQ(b.schema.to_toml(), a.schema.to_toml());
}

// Issue 15 (11): what the README promises: the field's name, the allowed range and, from a file,
// the file and line.
TEST(Config, RejectsOutOfRangeWithFieldNameRangeAndFileLine) {
  Fixture f;
  auto e = test::error_of([&] { f.schema.apply_override("train.steps", "0"); });
  EXPECT_NE(e.find("train.steps"), std::string::npos) << e;
  EXPECT_NE(e.find("0 is out of range"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed: [1, "), std::string::npos) << e;
  e = test::error_of([&] { f.schema.apply_override("optim.lr", "20"); });
  EXPECT_NE(e.find("allowed: [0, 10]"), std::string::npos) << e;
  test::TempDir d;
  std::ofstream(d.str("steps.toml")) << "# a run\n[train]\nbatch_size = 4\nsteps = 0\n";
  e = test::error_of([&] { f.schema.load_file(d.str("steps.toml")); });
  EXPECT_NE(e.find("steps.toml:4: config field 'train.steps': 0 is out of range"), std::string::npos) << e;
  EXPECT_NE(e.find("allowed: [1, "), std::string::npos) << e;
  std::ofstream(d.str("unknown.toml")) << "[train]\nsteps = 3\n\n[optim]\nlearning_rate = 0.1\n";
  e = test::error_of([&] { f.schema.load_file(d.str("unknown.toml")); });
  EXPECT_NE(e.find("unknown.toml:5: unknown config field 'optim.learning_rate'"), std::string::npos) << e;
  std::ofstream(d.str("type.toml")) << "[dist]\nmode = 3\n";
  e = test::error_of([&] { f.schema.load_file(d.str("type.toml")); });
  EXPECT_NE(e.find("type.toml:2: config field 'dist.mode': not a string"), std::string::npos) << e;
  EXPECT_NE(e.find("{none, ring, ps, auto}"), std::string::npos) << e;
  e = test::error_of([&] { f.schema.apply_override("optim.lr", "fast"); });
  EXPECT_NE(e.find("optim.lr"), std::string::npos) << e;
  e = test::error_of([&] { f.schema.apply_override("train.device", "tpu"); });
  EXPECT_NE(e.find("auto, cpu, cuda"), std::string::npos) << e;
  e = test::error_of([&] { f.schema.apply_override("train.stepz", "3"); });
  EXPECT_NE(e.find("unknown config field 'train.stepz'"), std::string::npos) << e;
}

TEST(Config, RejectsMalformedAndMissingFiles) {
  test::TempDir d;
  std::ofstream(d.str("bad.toml")) << "[train]\nsteps = = 3\n";
  Fixture f;
  auto e = test::error_of([&] { f.schema.load_file(d.str("bad.toml")); });
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
  EXPECT_NE(e.find("bad.toml:2"), std::string::npos) << e;
  e = test::error_of([&] { f.schema.load_file(d.str("missing.toml")); });
  EXPECT_NE(e.find("could not be opened"), std::string::npos) << e;
  std::ofstream(d.str("typo.toml")) << "[trian]\nsteps = 3\n";
  e = test::error_of([&] { f.schema.load_file(d.str("typo.toml")); });
  EXPECT_NE(e.find("typo.toml:1: unknown config section [trian]"), std::string::npos) << e;
  EXPECT_NE(e.find("check the spelling"), std::string::npos) << e;
}

TEST(Config, CrossFieldValidation) {
  Fixture f;
  f.schema.apply_args({"--model.n_embd=100", "--model.n_head=3"});
  auto e = test::error_of([&] { f.cfg.validate(); });
  EXPECT_NE(e.find("does not divide"), std::string::npos) << e;
  Fixture g;
  g.schema.apply_args({"--schedule.min_lr=1", "--optim.lr=0.1"});
  e = test::error_of([&] { g.cfg.validate(); });
  EXPECT_NE(e.find("schedule.min_lr"), std::string::npos) << e;
  Fixture h;  // a push during backward cannot wait for the global norm
  h.schema.apply_args({"--dist.ps_push_in_backward=true"});
  e = test::error_of([&] { h.cfg.validate(); });
  EXPECT_NE(e.find("--optim.grad_clip=0"), std::string::npos) << e;
  Fixture k;
  k.schema.apply_args({"--data.tokenizer=gpt2-bpe"});
  e = test::error_of([&] { k.cfg.validate(); });
  EXPECT_NE(e.find("needs data.vocab_file and data.merge_file"), std::string::npos) << e;
  Fixture m;  // parameter servers combine gradients each node clipped: a job-wide clip cannot be had
  m.schema.apply_args({"--dist.mode=ps", "--dist.servers=tcp://127.0.0.1:1", "--dist.clip_scope=job"});
  e = test::error_of([&] { m.cfg.validate(); });
  EXPECT_NE(e.find("--dist.clip_scope=node"), std::string::npos) << e;
  Fixture n;  // local SGD synchronizes nodes
  n.schema.apply_args({"--dist.sync_every=10"});
  e = test::error_of([&] { n.cfg.validate(); });
  EXPECT_NE(e.find("dist.sync_every=10 (local SGD / DiLoCo) with dist.mode=none"), std::string::npos) << e;
  Fixture o;
  o.schema.apply_args({"--dist.mode=ring", "--dist.sync_every=10", "--dist.clip_scope=job"});
  e = test::error_of([&] { o.cfg.validate(); });
  EXPECT_NE(e.find("each node steps on its own gradient"), std::string::npos) << e;
}

TEST(Config, HelpListsEveryField) {
  Fixture f;
  const std::string h = f.schema.help();
  for (const auto& b : f.schema.fields()) EXPECT_NE(h.find("--" + b.section + "." + b.name + "="), std::string::npos);
}
