// The trainer's data: token streams (flat files and indexed datasets), the window sampler's
// epochs and partition property, raw text tokenized into the cache, validation hold-out.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/data/indexed_dataset.h"
#include "common/text/byte_tokenizer.h"
#include "tests/test_helpers.h"
#include "worker/data/data_config.h"
#include "worker/data/window_sampler.h"

using namespace syncopate;
namespace fs = std::filesystem;

namespace {
void write_flat(const std::string& path, const std::vector<int64_t>& ids) {
  std::vector<uint16_t> buf(ids.begin(), ids.end());
  AtomicFile f(path);
  f.write(buf.data(), buf.size() * 2);
  f.commit();
}
}  // namespace

TEST(TokenStream, OpensFlatFilesAndIndexedDatasets) {
  test::TempDir d;
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = i % 500;
  write_flat(d.str("flat.bin"), ids);
  {
    IndexedDatasetWriter w(d.str("ds"), TokenDtype::kInt32);
    std::vector<int32_t> a(ids.begin(), ids.begin() + 600), b(ids.begin() + 600, ids.end());
    w.add_document(a.data(), a.size());
    w.add_document(b.data(), b.size());
    w.finish();
  }
  for (const std::string& p : {d.str("flat.bin"), d.str("ds"), d.str("ds.bin")}) {
    TokenStream s = TokenStream::open(p);
    ASSERT_EQ(s.size(), 1000) << p;
    std::vector<int64_t> out(10);
    s.copy(595, 10, out.data());
    EXPECT_EQ(out, std::vector<int64_t>(ids.begin() + 595, ids.begin() + 605)) << p;
  }
  TokenStream ds = TokenStream::open(d.str("ds"));
  EXPECT_EQ(ds.documents(), 2);
  EXPECT_EQ(ds.document_start(1), 600);
  TokenStream tail = ds.slice(600, 1000);
  EXPECT_EQ(tail.size(), 400);
  std::vector<int64_t> first(1);
  tail.copy(0, 1, first.data());
  EXPECT_EQ(first[0], ids[600]);
  EXPECT_NE(test::error_of([&] { tail.copy(399, 2, first.data()); }), "");

  std::ofstream(d.str("odd.bin")) << "abc";
  EXPECT_NE(test::error_of([&] { TokenStream::open(d.str("odd.bin")); }).find("not a whole number"), std::string::npos);
  EXPECT_NE(test::error_of([&] { TokenStream::open(d.str("missing.bin")); }).find("cannot open"), std::string::npos);
}

TEST(WindowSampler, WindowsAreShiftedTargetsFromTheStream) {
  test::TempDir d;
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = i % 500;
  write_flat(d.str("t.bin"), ids);
  TokenStream s = TokenStream::open(d.str("t.bin"));
  WindowSampler w(s, 16, 42, 500);
  EXPECT_EQ(w.windows(), 999 / 16);
  std::vector<int64_t> x(4 * 16), y(4 * 16);
  w.fill(0, 4, x.data(), y.data());
  for (int i = 0; i < 4; ++i) {
    const int64_t off = w.offset(i);
    EXPECT_EQ(off % 16, 0);
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(x[i * 16 + t], ids[off + t]);
      EXPECT_EQ(y[i * 16 + t], ids[off + t + 1]);
    }
  }
  WindowSampler small_vocab(s, 16, 42, 100);  // ids up to 499 do not fit a 100-id model
  EXPECT_NE(test::error_of([&] { small_vocab.fill(0, 4, x.data(), y.data()); }).find("model's vocabulary has 100 ids"),
            std::string::npos);
  std::vector<int64_t> few(10, 1);
  write_flat(d.str("few.bin"), few);
  TokenStream f = TokenStream::open(d.str("few.bin"));
  EXPECT_NE(test::error_of([&] { WindowSampler(f, 16, 1, 500); }).find("fewer than one window"), std::string::npos);
}

// Every epoch visits every window exactly once, in an order that changes with the epoch and seed.
TEST(WindowSampler, EpochsArePermutationsOfTheWindows) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    for (uint64_t key : {1ULL, 99ULL}) {
      std::set<int64_t> seen;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = permute(i, n, key);
        ASSERT_TRUE(p >= 0 && p < n);
        seen.insert(p);
      }
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << n;
    }
  }
  test::TempDir d;
  std::vector<int64_t> ids(16 * 50 + 1, 3);
  write_flat(d.str("t.bin"), ids);
  TokenStream s = TokenStream::open(d.str("t.bin"));
  WindowSampler w(s, 16, 5, 10);
  ASSERT_EQ(w.windows(), 50);
  std::vector<int64_t> e0, e1;
  for (int64_t k = 0; k < 50; ++k) e0.push_back(w.offset(k)), e1.push_back(w.offset(50 + k));
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 50u);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()), std::set<int64_t>(e1.begin(), e1.end()));
  EXPECT_NE(e0, e1);  // a new order each epoch
  EXPECT_EQ(w.epoch(49), 0);
  EXPECT_EQ(w.epoch(50), 1);
}

// n replicas with batch b see exactly what one process with batch n*b sees, each a disjoint slice.
TEST(WindowSampler, ReplicasPartitionTheGlobalBatch) {
  const int64_t b = 3, micro = 2;
  for (int64_t n = 1; n <= 8; ++n) {
    for (int64_t step = 0; step < 3; ++step) {
      const int64_t p = step * micro * n * b;  // data position at the step's start
      std::set<int64_t> all;
      for (int64_t m = 0; m < micro; ++m) {
        std::set<int64_t> seen;
        const int64_t single = WindowSampler::first_sample(p, m, 0, 1, n * b);
        for (int64_t r = 0; r < n; ++r) {
          const int64_t first = WindowSampler::first_sample(p, m, r, n, b);
          for (int64_t i = 0; i < b; ++i) EXPECT_TRUE(seen.insert(first + i).second) << "overlap";
        }
        EXPECT_EQ(*seen.begin(), single);
        EXPECT_EQ(*seen.rbegin(), single + n * b - 1);
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n * b);
        all.insert(seen.begin(), seen.end());
      }
      EXPECT_EQ(*all.begin(), p);
      EXPECT_EQ(*all.rbegin(), p + micro * n * b - 1);  // the step's samples, no gaps
    }
  }
}

// Issue 15 (12): the same, on the tokens themselves and across epoch boundaries: a corpus of 7
// windows, global batches of 6 to 24 samples, so most steps straddle one or more epochs; n
// replicas' rows, in (micro, replica) order, are exactly the single process's rows.
TEST(WindowSampler, ReplicasSeeTheSingleProcessTokensAcrossEpochBoundaries) {
  test::TempDir d;
  std::vector<int64_t> ids(7 * 4 + 1);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);  // every window distinct
  write_flat(d.str("t.bin"), ids);
  TokenStream s = TokenStream::open(d.str("t.bin"));
  const int64_t ctx = 4, b = 3, micro = 2;
  WindowSampler w(s, ctx, 9, 100);
  ASSERT_EQ(w.windows(), 7);
  bool crossed = false;
  for (int64_t n : {1, 2, 4}) {
    for (int64_t step = 0; step < 5; ++step) {
      const int64_t p = step * micro * n * b;
      crossed = crossed || w.epoch(p) != w.epoch(p + micro * n * b - 1);
      for (int64_t m = 0; m < micro; ++m) {
        std::vector<int64_t> sx(static_cast<size_t>(n * b * ctx)), sy(sx.size());
        w.fill(WindowSampler::first_sample(p, m, 0, 1, n * b), n * b, sx.data(), sy.data());
        std::vector<int64_t> rx, ry;
        for (int64_t r = 0; r < n; ++r) {
          std::vector<int64_t> x(static_cast<size_t>(b * ctx)), y(x.size());
          w.fill(WindowSampler::first_sample(p, m, r, n, b), b, x.data(), y.data());
          rx.insert(rx.end(), x.begin(), x.end());
          ry.insert(ry.end(), y.begin(), y.end());
        }
        EXPECT_EQ(rx, sx) << "n " << n << " step " << step << " micro " << m;
        EXPECT_EQ(ry, sy);
      }
    }
  }
  EXPECT_TRUE(crossed);
  // And an epoch is the windows in a new order: samples 0..6 and 7..13 hold the same rows.
  std::vector<int64_t> e0(7 * ctx), e1(7 * ctx), y(7 * ctx);
  w.fill(0, 7, e0.data(), y.data());
  w.fill(7, 7, e1.data(), y.data());
  EXPECT_NE(e0, e1);
  std::vector<std::vector<int64_t>> r0, r1;
  for (int64_t i = 0; i < 7; ++i) {
    r0.emplace_back(e0.begin() + i * ctx, e0.begin() + (i + 1) * ctx);
    r1.emplace_back(e1.begin() + i * ctx, e1.begin() + (i + 1) * ctx);
  }
  std::sort(r0.begin(), r0.end());
  std::sort(r1.begin(), r1.end());
  EXPECT_EQ(r0, r1);
}

TEST(TrainingData, RawTextIsTokenizedOnceAndCached) {
  test::TempDir d;
  DataConfig c;
  c.corpus = test::write_tiny_corpus(d, 5000);
  c.cache_dir = d.str("cache");
  ByteTokenizer bt;
  auto data = open_training_data(c, bt, 32, false);
  EXPECT_EQ(data.train.size() + data.val.size(), static_cast<int64_t>(fs::file_size(c.corpus)) + 1);  // + end-of-document
  EXPECT_GE(data.val.size(), 33);
  fs::path idx;
  for (const auto& e : fs::recursive_directory_iterator(d.str("cache")))
    if (e.path().extension() == ".idx") idx = e.path();
  ASSERT_FALSE(idx.empty());
  const auto mtime = fs::last_write_time(idx);
  auto again = open_training_data(c, bt, 32, false);
  EXPECT_EQ(fs::last_write_time(idx), mtime);
  EXPECT_EQ(again.train.size(), data.train.size());
  c.corpus = d.str("nope");
  EXPECT_NE(test::error_of([&] { open_training_data(c, bt, 32, false); }).find("does not exist"), std::string::npos);
}

TEST(TrainingData, HoldsOutTheLastDocumentsOfADataset) {
  test::TempDir d;
  {
    IndexedDatasetWriter w(d.str("ds"), TokenDtype::kUint16);
    for (int i = 0; i < 100; ++i) {
      std::vector<int32_t> doc(100, i);
      w.add_document(doc.data(), doc.size());
    }
    w.finish();
  }
  DataConfig c;
  c.train_file = d.str("ds");
  c.val_fraction = 0.1;
  ByteTokenizer bt;
  auto data = open_training_data(c, bt, 32, false);
  EXPECT_EQ(data.train.size(), 9000);
  EXPECT_EQ(data.val.size(), 1000);
  std::vector<int64_t> first(1);
  data.val.copy(0, 1, first.data());
  EXPECT_EQ(first[0], 90);  // document 90 is the first held out
  c.val_file = d.str("ds");  // an explicit validation set is used as given
  EXPECT_EQ(open_training_data(c, bt, 32, false).val.size(), 10000);
}
