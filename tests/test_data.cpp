// Token files, the window sampler's partition property, corpus preparation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/check.h"
#include "tests/test_helpers.h"
#include "worker/data_config.h"
#include "worker/token_file.h"
#include "worker/window_sampler.h"

using namespace syncopate;

TEST(TokenFile, ShorterThanOneWindowIsAClearError) {
  test::TempDir d;
  std::vector<int64_t> ids(10, 7);
  write_token_file(d.str("t.bin"), ids.data(), 10);
  try {
    TokenFile f(d.str("t.bin"), 33);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one window of 33 tokens"), std::string::npos) << e.what();
  }
  std::ofstream(d.str("odd.bin")) << "abc";
  EXPECT_THROW(TokenFile(d.str("odd.bin"), 1), Error);
  EXPECT_THROW(TokenFile(d.str("missing.bin"), 1), Error);
  std::vector<int64_t> big = {70000};
  EXPECT_THROW(write_token_file(d.str("big.bin"), big.data(), 1), Error);
}

TEST(WindowSampler, WindowsAreShiftedTargetsFromTheFile) {
  test::TempDir d;
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = i % 500;
  write_token_file(d.str("t.bin"), ids.data(), 1000);
  TokenFile f(d.str("t.bin"), 17);
  WindowSampler s(f, 16, 42);
  std::vector<int64_t> x(4 * 16), y(4 * 16);
  s.fill(0, 4, x.data(), y.data());
  for (int i = 0; i < 4; ++i) {
    const int64_t off = s.offset(i);
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(x[i * 16 + t], ids[off + t]);
      EXPECT_EQ(y[i * 16 + t], ids[off + t + 1]);
    }
  }
}

// n replicas with batch b see exactly what one process with batch n*b sees, each a disjoint slice.
TEST(WindowSampler, ReplicasPartitionTheGlobalBatch) {
  const int64_t b = 3, micro = 2;
  for (int64_t n = 1; n <= 8; ++n) {
    for (int64_t step = 0; step < 3; ++step) {
      for (int64_t m = 0; m < micro; ++m) {
        std::set<int64_t> seen;
        const int64_t single = WindowSampler::first_sample(step, m, micro, 0, 1, n * b);
        for (int64_t r = 0; r < n; ++r) {
          const int64_t first = WindowSampler::first_sample(step, m, micro, r, n, b);
          for (int64_t i = 0; i < b; ++i) EXPECT_TRUE(seen.insert(first + i).second) << "overlap";
        }
        EXPECT_EQ(*seen.begin(), single);
        EXPECT_EQ(*seen.rbegin(), single + n * b - 1);
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n * b);
      }
    }
  }
}

TEST(Corpus, TokenizesOnceAndCaches) {
  test::TempDir d;
  DataConfig c;
  c.corpus = test::write_tiny_corpus(d, 5000);
  c.cache_dir = d.str("cache");
  auto files = prepare_token_files(c, false);
  TokenFile train(files.train, 1), val(files.val, 1);
  EXPECT_EQ(train.size() + val.size(), static_cast<int64_t>(std::filesystem::file_size(c.corpus)) + 1);  // + end-of-document
  const auto mtime = std::filesystem::last_write_time(files.train);
  auto again = prepare_token_files(c, false);
  EXPECT_EQ(again.train, files.train);
  EXPECT_EQ(std::filesystem::last_write_time(again.train), mtime);
  c.corpus = d.str("nope");
  EXPECT_THROW(prepare_token_files(c, false), Error);
}
