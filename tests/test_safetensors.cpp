// safetensors reading/writing, hostile files, and weights exchanged with Hugging Face GPT-2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "common/check.h"
#include "common/safetensors.h"
#include "model/gpt.h"
#include "model/hf_weights.h"
#include "tests/test_helpers.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << std::string(data_bytes, '\0');
}
}  // namespace

TEST(Safetensors, RoundTripKeepsValuesDtypesAndMetadata) {
  test::TempDir d;
  std::vector<std::pair<std::string, at::Tensor>> t = {
      {"a", torch::randn({3, 5})}, {"b", torch::arange(7, torch::kLong)},
      {"c", torch::randn({2, 2}).to(torch::kBFloat16)}, {"empty", torch::zeros({0, 4})}};
  save_safetensors(d.str("x.safetensors"), t, {{"k", "v"}});
  auto back = load_safetensors(d.str("x.safetensors"));
  ASSERT_EQ(back.tensors.size(), 4u);
  for (auto& [name, v] : t) EXPECT_TRUE(torch::equal(back.tensors.at(name), v)) << name;
  EXPECT_EQ(back.metadata.at("k"), "v");
  uint64_t header_len = 0;
  std::ifstream(d.str("x.safetensors"), std::ios::binary).read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);  // data starts 8-byte aligned
}

TEST(Safetensors, HostileFilesAreErrors) {
  test::TempDir d;
  const std::string p = d.str("bad.safetensors");
  std::ofstream(p) << "abc";
  EXPECT_NE(test::error_of([&] { load_safetensors(p); }).find("too short"), std::string::npos);
  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8);  // truncated data
  EXPECT_NE(test::error_of([&] { load_safetensors(p); }).find("outside the file"), std::string::npos);
  write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[0,16]}}", 16);  // size mismatch
  EXPECT_NE(test::error_of([&] { load_safetensors(p); }).find("needs 20 bytes"), std::string::npos);
  write_raw(p, "{not json", 0);
  EXPECT_NE(test::error_of([&] { load_safetensors(p); }).find("not valid JSON"), std::string::npos);
  write_raw(p, "{\"a\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  EXPECT_NE(test::error_of([&] { load_safetensors(p); }).find("unsupported"), std::string::npos);
  {  // header length far beyond the file
    std::ofstream f(p, std::ios::binary);
    uint64_t n = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&n), 8);
  }
  EXPECT_NE(test::error_of([&] { load_safetensors(p); }).find("exceeds the file size"), std::string::npos);
}

TEST(HfWeights, ExportImportRoundTripAndInference) {
  test::TempDir d;
  GPTConfig c = gpt_preset("tiny");
  c.n_embd = 32;
  c.n_head = 2;
  c.vocab_size = 300;
  torch::manual_seed(0);
  GPT a(c);
  save_model_safetensors(*a, d.str("m.safetensors"));
  auto st = load_safetensors(d.str("m.safetensors"));
  EXPECT_EQ(st.tensors.at("wte.weight").size(0), 300);               // padding cropped
  EXPECT_EQ(st.tensors.at("h.0.attn.c_attn.weight").sizes(), (std::vector<int64_t>{32, 96}));  // Conv1D layout
  GPTConfig inferred = infer_gpt_config(st, GPTConfig{});
  EXPECT_EQ(inferred.n_layer, c.n_layer);
  EXPECT_EQ(inferred.n_head, 2);  // from the file's metadata
  torch::manual_seed(1);
  GPT b(inferred);
  load_hf_tensors(*b, st, "m");
  a->eval();
  b->eval();
  auto idx = torch::randint(0, 300, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::equal(a->forward(idx), b->forward(idx)));
}

// Same random weights in transformers' GPT2LMHeadModel and in ours give the same logits, both ways.
TEST(HfWeights, MatchesTransformersGPT2LMHeadModel) {
  test::TempDir d;
  const std::string py = std::string(SYNCOPATE_PYTHON) + " " + SYNCOPATE_SOURCE_DIR + "/tests/hf_reference.py";
  auto r = test::run_command(py + " make " + d.str());
  ASSERT_EQ(r.exit_code, 0) << r.output << "\n(transformers comes from scripts/setup.sh)";
  auto st = load_safetensors(d.str("hf/model.safetensors"));
  EXPECT_TRUE(st.tensors.count("transformer.wte.weight"));  // HF writes the prefixed names
  GPTConfig base;
  base.n_head = 4;
  GPTConfig c = infer_gpt_config(st, base);
  ASSERT_EQ(c.vocab_size, 300);
  ASSERT_EQ(c.n_layer, 2);
  GPT m(c);
  load_hf_tensors(*m, st, "hf");
  m->eval();
  auto ref = load_safetensors(d.str("ref.safetensors"));
  auto logits = m->forward(ref.tensors.at("ids")).narrow(-1, 0, 300);
  EXPECT_TRUE(torch::allclose(logits, ref.tensors.at("logits"), 1e-4, 1e-4))
      << (logits - ref.tensors.at("logits")).abs().max().item<double>();
  // And back: our export loads into transformers and reproduces our logits.
  save_model_safetensors(*m, d.str("ours.safetensors"));
  save_safetensors(d.str("ours_logits.safetensors"), {{"ids", ref.tensors.at("ids")}, {"logits", logits.contiguous()}});
  r = test::run_command(py + " check " + d.str());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}
