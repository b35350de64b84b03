// syncopate-data: loose JSON -> .bin/.idx -> our reader, skips and errors, splits, workers, CLI.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/data/indexed_dataset.h"
#include "common/data/preprocess.h"
#include "common/text/byte_tokenizer.h"
#include "tests/test_helpers.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
std::vector<std::string> documents(int n) {
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i)
    docs.push_back(fmt::format("document {}: naïve café, 日本語 🙂 \"quoted\"\nline two\t{}", i, std::string(i % 7, ' ')));
  return docs;
}
std::string write_jsonl(const test::TempDir& d, const std::string& name, const std::vector<std::string>& docs) {
  std::ofstream f(d.str(name));
  for (const auto& t : docs) f << nlohmann::json{{"text", t}, {"meta", 1}}.dump() << "\n";
  return d.str(name);
}
PreprocessConfig config(const std::string& input, const std::string& prefix) {
  PreprocessConfig c;
  c.inputs = {input};
  c.output_prefix = prefix;
  c.append_eod = true;
  return c;
}
}  // namespace

TEST(Preprocess, LooseJsonRoundTripsThroughTheIndexedDataset) {
  test::TempDir d;
  const auto docs = documents(500);
  std::ostringstream log;
  const auto st = preprocess(config(write_jsonl(d, "in.jsonl", docs), d.str("out/c")), log);
  EXPECT_EQ(st.documents, 500);
  EXPECT_EQ(st.skipped(), 0);
  ASSERT_EQ(st.outputs, std::vector<std::string>{d.str("out/c_text_document")});
  IndexedDataset ds(d.str("out/c_text_document"));
  ASSERT_EQ(ds.documents(), 500);
  ByteTokenizer bt;
  for (int i = 0; i < 500; ++i) {
    const auto ids = ds.document(i);
    ASSERT_EQ(ids.back(), ByteTokenizer::kEod);
    EXPECT_EQ(bt.decode(std::vector<int64_t>(ids.begin(), ids.end())), docs[static_cast<size_t>(i)]) << i;
  }
}

TEST(Preprocess, OutputDoesNotDependOnWorkers) {
  test::TempDir d;
  std::vector<std::string> docs;
  for (int i = 0; i < 3000; ++i) docs.push_back(std::string(1000 + i % 500, static_cast<char>('a' + i % 26)));  // ~3.7 MB: several blocks
  const std::string in = write_jsonl(d, "in.jsonl", docs);
  std::ostringstream log;
  auto c1 = config(in, d.str("one")), c3 = config(in, d.str("three"));
  c3.workers = 3;
  c1.valid_fraction = c3.valid_fraction = 0.1;
  preprocess(c1, log);
  preprocess(c3, log);
  for (const char* suffix : {"_text_document", "_valid_text_document"})
    for (const char* ext : {".bin", ".idx"})
      EXPECT_EQ(test::slurp(d.str(std::string("one") + suffix + ext)), test::slurp(d.str(std::string("three") + suffix + ext)))
          << suffix << ext;
}

TEST(Preprocess, ValidationSplitPartitionsTheDocuments) {
  test::TempDir d;
  const auto docs = documents(400);
  auto c = config(write_jsonl(d, "in.jsonl", docs), d.str("s"));
  c.valid_fraction = 0.2;
  std::ostringstream log;
  preprocess(c, log);
  IndexedDataset train(d.str("s_text_document")), valid(d.str("s_valid_text_document"));
  EXPECT_EQ(train.documents() + valid.documents(), 400);
  EXPECT_GT(valid.documents(), 40);   // ~80 expected
  EXPECT_LT(valid.documents(), 130);
  std::multiset<std::vector<int32_t>> seen;
  for (int64_t i = 0; i < train.documents(); ++i) seen.insert(train.document(i));
  for (int64_t i = 0; i < valid.documents(); ++i) seen.insert(valid.document(i));
  ByteTokenizer bt;
  for (const auto& t : docs) {
    auto ids = bt.encode(t);
    ids.push_back(ByteTokenizer::kEod);
    EXPECT_EQ(seen.count(ids), 1u);
  }
}

TEST(Preprocess, BadDocumentsAreCountedSkipsWithFileAndLine) {
  test::TempDir d;
  {
    std::ofstream f(d.str("bad.jsonl"), std::ios::binary);
    f << R"({"text": "good one"})" << "\n"
      << "this is not json\n"                                    // line 2
      << R"({"body": "no text key"})" << "\n"                    // line 3
      << "{\"text\": \"bad \xff utf8\"}\n"                       // line 4
      << R"({"text": ""})" << "\n"                               // line 5: empty
      << "\n"                                                     // blank: not a document
      << R"([1, 2])" << "\n"                                     // line 7: not an object
      << R"({"text": 42})" << "\n"                               // line 8: not a string
      << R"({"text": "good two"})" << "\n";
  }
  std::ostringstream log;
  const auto st = preprocess(config(d.str("bad.jsonl"), d.str("o")), log);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(st.skipped_bad_json, 2);
  EXPECT_EQ(st.skipped_missing_key, 2);
  EXPECT_EQ(st.skipped_invalid_utf8, 1);
  EXPECT_EQ(st.skipped_empty, 1);
  EXPECT_NE(log.str().find("bad.jsonl:2: not JSON"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("bad.jsonl:4: invalid UTF-8"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("more skipped documents not shown"), std::string::npos) << log.str();
  auto strict = config(d.str("bad.jsonl"), d.str("strict"));
  strict.strict = true;
  const std::string msg = test::error_of([&] { preprocess(strict, log); });
  EXPECT_NE(msg.find("bad.jsonl:2: not JSON"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.str("strict_text_document.idx")));
  std::ofstream(d.str("none.jsonl")) << "nope\n";
  EXPECT_NE(test::error_of([&] { preprocess(config(d.str("none.jsonl"), d.str("n")), log); }).find("no document could be tokenized"),
            std::string::npos);
}

// Several rounds of blocks (about 4 MB at 1 MB per block, 2 blocks per round with one worker):
// every skip is counted once, however many rounds it takes.
TEST(Preprocess, SkipCountsAreExactOverManyRounds) {
  test::TempDir d;
  int bad = 0;
  {
    std::ofstream f(d.str("many.jsonl"));
    for (int i = 0; i < 4000; ++i) {
      if (i % 250 == 7) {
        f << "not json " << i << "\n";
        ++bad;
      } else {
        f << nlohmann::json{{"text", std::string(1000, static_cast<char>('a' + i % 26))}}.dump() << "\n";
      }
    }
  }
  std::ostringstream log;
  const auto st = preprocess(config(d.str("many.jsonl"), d.str("m")), log);
  EXPECT_EQ(st.skipped_bad_json, bad);
  EXPECT_EQ(st.skipped(), bad);
  EXPECT_EQ(st.documents, 4000 - bad);
  EXPECT_EQ(IndexedDataset(d.str("m_text_document")).documents(), 4000 - bad);
}

TEST(Preprocess, TextFilesFlatOutputAndSeveralKeys) {
  test::TempDir d;
  fs::create_directories(d.str("txt/sub"));
  std::ofstream(d.str("txt/a.txt")) << "alpha";
  std::ofstream(d.str("txt/sub/b.md")) << "beta!";
  auto c = config(d.str("txt"), d.str("flat"));
  c.format = "flat";
  std::ostringstream log;
  const auto st = preprocess(c, log);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(fs::file_size(d.str("flat_text_document.bin")), 2u * (5 + 1 + 5 + 1));
  EXPECT_FALSE(fs::exists(d.str("flat_text_document.idx")));

  std::ofstream(d.str("two.jsonl")) << R"({"title": "T1", "text": "body one"})" << "\n" << R"({"title": "T2", "text": "body two"})" << "\n";
  auto k = config(d.str("two.jsonl"), d.str("k"));
  k.json_keys = {"title", "text"};
  preprocess(k, log);
  EXPECT_EQ(IndexedDataset(d.str("k_title_document")).documents(), 2);
  EXPECT_EQ(IndexedDataset(d.str("k_text_document")).tokens(), 2 * (8 + 1));
}

TEST(SyncopateData, CommandLineMirrorsMegatronFlags) {
  test::TempDir d;
  const std::string in = write_jsonl(d, "in.jsonl", documents(50));
  const std::string bin = std::string(SYNCOPATE_BIN_DIR) + "/syncopate-data";
  auto r = test::run_command(fmt::format("{} --input {} --output-prefix {} --json-keys text --tokenizer-type byte "
                                         "--append-eod --workers 2 --dataset-impl mmap 2>&1",
                                         bin, in, d.str("cli")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("documents 50"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MB/s with 2 workers"), std::string::npos) << r.output;
  EXPECT_EQ(IndexedDataset(d.str("cli_text_document")).documents(), 50);
  r = test::run_command(fmt::format("{} --input {} --output-prefix {} --tokenizer-type GPT2BPETokenizer --vocab-file {} 2>&1",
                                    bin, in, d.str("x"), in));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("without its merges"), std::string::npos) << r.output;
  r = test::run_command(fmt::format("{} --input {} --output-prefix {} --tokenizer-type GPT2BPETokenizer --vocab-file {} "
                                    "--merge-file {} 2>&1", bin, in, d.str("x"), d.str("missing.json"), in));
  EXPECT_NE(r.output.find("cannot open the vocabulary"), std::string::npos) << r.output;
  r = test::run_command(fmt::format("{} --input {} --output-prefix {} 2>&1", bin, d.str("nope.jsonl"), d.str("x")));
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
}
