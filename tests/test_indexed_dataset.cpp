// Megatron-LM's .bin/.idx: our writer, our reader, Megatron's own reader, damaged files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/data/indexed_dataset.h"
#include "tests/test_helpers.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
std::vector<std::vector<int32_t>> random_docs(int n, int32_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(rng() % 50);  // empty documents included
    for (auto& t : d) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  }
  return docs;
}
void write(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs, TokenDtype dt) {
  IndexedDatasetWriter w(prefix, dt);
  for (const auto& d : docs) w.add_document(d.data(), d.size());
  w.finish();
}
}  // namespace

TEST(IndexedDataset, RoundTripsEveryDocumentInBothDtypes) {
  test::TempDir dir;
  for (auto [dt, vocab] : {std::pair{TokenDtype::kUint16, 50257}, std::pair{TokenDtype::kInt32, 200000}}) {
    const auto docs = random_docs(300, vocab, 3);
    write(dir.str("ds"), docs, dt);
    IndexedDataset ds(dir.str("ds"));
    ASSERT_EQ(ds.documents(), 300);
    EXPECT_EQ(ds.dtype(), dt);
    int64_t tokens = 0;
    for (int i = 0; i < 300; ++i) {
      EXPECT_EQ(ds.document(i), docs[static_cast<size_t>(i)]) << i;
      EXPECT_EQ(ds.document_start(i), tokens);
      tokens += static_cast<int64_t>(docs[static_cast<size_t>(i)].size());
    }
    EXPECT_EQ(ds.tokens(), tokens);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir.str("ds.bin"))), tokens * static_cast<int64_t>(dtype_bytes(dt)));
  }
  EXPECT_EQ(dtype_for_vocab(50257), TokenDtype::kUint16);
  EXPECT_EQ(dtype_for_vocab(65500), TokenDtype::kInt32);
}

// Megatron-LM's own code (megatron-core) reads what we write and we read what it writes, in both
// token widths (uint16 for GPT-2's vocabulary, int32 above 65535 ids).
TEST(IndexedDataset, MegatronReadsWhatWeWriteAndWeReadWhatMegatronWrites) {
  test::TempDir dir;
  const std::vector<std::tuple<TokenDtype, int32_t, std::string>> kinds = {{TokenDtype::kUint16, 50257, "uint16"},
                                                                           {TokenDtype::kInt32, 200000, "int32"}};
  nlohmann::json jobs = nlohmann::json::array();
  std::vector<std::vector<std::vector<int32_t>>> docs;
  for (const auto& [dt, vocab, name] : kinds) {
    docs.push_back(random_docs(40, vocab, static_cast<unsigned>(vocab)));
    write(dir.str("ours_" + name), docs.back(), dt);
    jobs.push_back({{"read", dir.str("ours_" + name)}});
    jobs.push_back({{"write", dir.str("theirs_" + name)}, {"dtype", name}, {"docs", docs.back()}});
  }
  std::ofstream(dir.str("jobs.json")) << jobs.dump();
  const auto r = test::run_command(fmt::format("{} {}/tests/megatron_reader.py {} 2>/dev/null", SYNCOPATE_PYTHON,
                                               SYNCOPATE_SOURCE_DIR, dir.str("jobs.json")));
  ASSERT_EQ(r.exit_code, 0) << "megatron-core missing? scripts/setup.sh installs it\n" << r.output;
  const auto results = nlohmann::json::parse(r.output.substr(r.output.rfind("\n[") + 1));  // torch may log before it
  for (size_t k = 0; k < kinds.size(); ++k) {
    const auto& [dt, vocab, name] = kinds[k];
    const auto& mine = docs[k];
    const auto& j = results[2 * k];  // Megatron read ours
    EXPECT_EQ(j["dtype"], name);
    ASSERT_EQ(j["docs"].size(), mine.size());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(j["docs"][i].get<std::vector<int32_t>>(), mine[i]) << name << " " << i;
    EXPECT_EQ(j["document_indices"].size(), mine.size() + 1);
    IndexedDataset theirs(dir.str("theirs_" + name));  // we read Megatron's
    EXPECT_EQ(theirs.dtype(), dt);
    ASSERT_EQ(theirs.documents(), static_cast<int64_t>(mine.size()));
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(theirs.document(static_cast<int64_t>(i)), mine[i]) << name << " " << i;
  }
}

TEST(IndexedDataset, DamagedFilesAreClearErrors) {
  test::TempDir dir;
  write(dir.str("ds"), random_docs(20, 1000, 9), TokenDtype::kUint16);
  auto copy_cut = [&](const std::string& name, const std::string& which, int64_t cut) {
    fs::copy_file(dir.str("ds.idx"), dir.str(name + ".idx"));
    fs::copy_file(dir.str("ds.bin"), dir.str(name + ".bin"));
    const std::string p = dir.str(name + "." + which);
    fs::resize_file(p, static_cast<uintmax_t>(static_cast<int64_t>(fs::file_size(p)) + cut));
  };
  copy_cut("short_idx", "idx", -8);
  std::string msg = test::error_of([&] { IndexedDataset(dir.str("short_idx")); });
  EXPECT_NE(msg.find("truncated or corrupt"), std::string::npos) << msg;
  copy_cut("short_bin", "bin", -2);
  msg = test::error_of([&] { IndexedDataset(dir.str("short_bin")); });
  EXPECT_NE(msg.find("describes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("short_bin.bin"), std::string::npos) << msg;
  copy_cut("long_bin", "bin", +6);
  EXPECT_NE(test::error_of([&] { IndexedDataset(dir.str("long_bin")); }), "");
  std::ofstream(dir.str("magic.idx")) << "NOTANINDEX-and-some-more-bytes-to-be-long-enough";
  std::ofstream(dir.str("magic.bin")) << "";
  EXPECT_NE(test::error_of([&] { IndexedDataset(dir.str("magic")); }).find("no MMIDIDX header"), std::string::npos);
  fs::copy_file(dir.str("ds.idx"), dir.str("nobin.idx"));
  EXPECT_NE(test::error_of([&] { IndexedDataset(dir.str("nobin")); }).find("nobin.bin"), std::string::npos);
  {  // a header claiming 2^60 sequences must not allocate or overflow
    std::string idx = test::slurp(dir.str("ds.idx"));
    const uint64_t huge = uint64_t{1} << 60;
    std::memcpy(&idx[18], &huge, 8);
    std::ofstream(dir.str("huge.idx"), std::ios::binary) << idx;
    fs::copy_file(dir.str("ds.bin"), dir.str("huge.bin"));
    EXPECT_NE(test::error_of([&] { IndexedDataset(dir.str("huge")); }).find("truncated or corrupt"), std::string::npos);
  }
}

TEST(IndexedDataset, AnUnfinishedWriterLeavesNoFiles) {
  test::TempDir dir;
  {
    IndexedDatasetWriter w(dir.str("ds"), TokenDtype::kUint16);
    std::vector<int32_t> d = {1, 2, 3};
    w.add_document(d.data(), d.size());
    std::vector<int32_t> big = {70000};
    EXPECT_NE(test::error_of([&] { w.add_document(big.data(), 1); }).find("does not fit"), std::string::npos);
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

// Random damage to a valid index: every result is either a readable dataset (all documents
// inside the .bin) or a syncopate::Error; never a crash, never an out-of-bounds read.
TEST(IndexedDataset, RandomlyDamagedIndexNeverCrashes) {
  test::TempDir dir;
  write(dir.str("ds"), random_docs(30, 1000, 11), TokenDtype::kUint16);
  const std::string good = test::slurp(dir.str("ds.idx"));
  fs::copy_file(dir.str("ds.bin"), dir.str("m.bin"));
  std::mt19937 rng(2026);
  int opened = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    std::string idx = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) idx[rng() % idx.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) idx.resize(rng() % idx.size());
    std::ofstream(dir.str("m.idx"), std::ios::binary | std::ios::trunc) << idx;
    try {
      IndexedDataset ds(dir.str("m"));
      for (int64_t d = 0; d < ds.documents(); ++d) ds.document(d);
      ++opened;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_EQ(opened + refused, 400);
  EXPECT_GT(refused, 200);  // most damage is detected (a document index that stays monotone is not: it is still a valid index)
}
