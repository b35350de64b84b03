// BucketReducer: DDP's bucket cut, and regions reduced from gradient hooks during backward, in
// descending order, only in an armed backward, with the final gradient values.
#include <gtest/gtest.h>

#include <mutex>

#include <torch/torch.h>

#include "common/check.h"
#include "worker/sync/bucket_reducer.h"
#include "model/flat_parameters.h"

using namespace syncopate;

TEST(BucketBounds, DdpBucketsFromTheLastParameter) {
  // Sizes 10, 20, 5, 40 at offsets 0, 10, 30, 35. From the last: {40} reaches the first cap (30)
  // and closes; then {5, 20, 10} stays under the cap of 50.
  const std::vector<std::pair<int64_t, int64_t>> ranges{{0, 10}, {10, 20}, {30, 5}, {35, 40}};
  EXPECT_EQ(bucket_bounds(ranges, 30, 50), (std::vector<int64_t>{0, 35, 75}));
  // Caps of one element: every parameter its own bucket.
  EXPECT_EQ(bucket_bounds(ranges, 1, 1), (std::vector<int64_t>{0, 10, 30, 35, 75}));
  // Huge caps: one bucket.
  EXPECT_EQ(bucket_bounds(ranges, 1000, 1000), (std::vector<int64_t>{0, 75}));
}

namespace {
struct Chain : torch::nn::Module {  // y = w3 * w2 * w1 * w0 * x: backward finishes w3 first
  std::vector<torch::Tensor> w;
  Chain() {
    for (int i = 0; i < 4; ++i) w.push_back(register_parameter("w" + std::to_string(i), torch::full({3}, 1.0 + i)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return (x * w[0] * w[1] * w[2] * w[3]).sum(); }
};
}  // namespace

TEST(BucketReducer, ReducesEachRegionOnceInDescendingOrderOnlyWhenArmed) {
  Chain m;
  FlatParameters flat(m);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& s : flat.segments) ranges.emplace_back(s.offset, s.numel);
  std::mutex mu;
  std::vector<int> seen;
  std::vector<at::Tensor> values;
  BucketReducer br(m.parameters(), ranges, flat.grads, {0, 6, 12}, /*device=*/-1, [&](int region, at::Tensor view) {
    std::lock_guard<std::mutex> l(mu);
    seen.push_back(region);
    values.push_back(view.clone());
    view.mul_(10);  // the "reduction" acts on the flat buffer itself
  });
  EXPECT_EQ(br.regions(), 2);
  const auto x = torch::ones({3});

  flat.zero_grad();
  m.forward(x).backward();  // not armed: nothing is reduced
  EXPECT_FALSE(br.finish());
  EXPECT_TRUE(seen.empty());

  for (int step = 0; step < 2; ++step) {
    seen.clear();
    values.clear();
    flat.zero_grad();
    m.forward(x).backward();  // an earlier micro-batch: accumulates, launches nothing
    br.arm();
    m.forward(x).backward();
    EXPECT_TRUE(br.finish());
    ASSERT_EQ(seen, (std::vector<int>{1, 0}));  // the last region (w2, w3) first
    // d/dw_i of prod = prod of the others: 24 / (1 + i), accumulated over 2 backwards.
    for (int region = 0; region < 2; ++region) {
      at::Tensor expect = torch::cat({torch::full({3}, 2 * 24.0 / (1 + 2 * region)), torch::full({3}, 2 * 24.0 / (2 + 2 * region))});
      EXPECT_TRUE(torch::allclose(values[1 - region], expect)) << region << ": " << values[1 - region];
    }
    EXPECT_TRUE(torch::allclose(flat.grads.slice(0, 0, 3), torch::full({3}, 480.0)));  // reduced in place
  }
  EXPECT_EQ(br.reduced(), 4);
}

TEST(BucketReducer, AFailedReductionIsRethrownByFinish) {
  Chain m;
  FlatParameters flat(m);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& s : flat.segments) ranges.emplace_back(s.offset, s.numel);
  BucketReducer br(m.parameters(), ranges, flat.grads, {0, 12}, -1, [](int, at::Tensor) {
    SYN_FAIL("receiving from node 1 failed: the connection was closed", "the peer died");
  });
  br.arm();
  m.forward(torch::ones({3})).backward();
  try {
    br.finish();
    FAIL() << "finish() returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 1"), std::string::npos) << e.what();
  }
}
