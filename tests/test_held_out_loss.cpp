// held_out_loss (worker/train/held_out_loss.h): the validation loss scored many windows per forward
// pass equals the readable reference, one window at a time, for every grouping (one that does not
// divide the set included).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "common/atomic_file.h"
#include "model/gpt.h"
#include "tests/test_helpers.h"
#include "worker/data/held_out_set.h"
#include "worker/data/token_stream.h"
#include "worker/train/held_out_loss.h"

using namespace syncopate;

TEST(HeldOutLoss, ManyWindowsPerForwardEqualTheOneWindowReference) {
  test::TempDir d;
  std::vector<uint16_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7919 + i / 13) % 257);
  AtomicFile f(d.str("val.bin"));
  f.write(ids.data(), ids.size() * 2);
  f.commit();
  GPTConfig c = gpt_preset("micro");
  torch::manual_seed(3);
  GPT model(c);
  model->eval();
  torch::NoGradGuard no_grad;
  const TokenStream val = TokenStream::open(d.str("val.bin"));
  const HeldOutSet set(val, c.block_size, 37, 1, c.vocab_size);
  int64_t calls = 0;
  auto loss = [&](const at::Tensor& x, const at::Tensor& y) {
    ++calls;
    return model->loss(x, y).item<double>();
  };
  // The reference: each window's own mean loss, averaged over the windows.
  double reference = 0;
  for (int64_t w = 0; w < set.windows(); ++w) {
    at::Tensor x = torch::empty({1, c.block_size}, torch::kLong), y = torch::empty_like(x);
    set.fill(w, 1, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    reference += model->loss(x, y).item<double>();
  }
  reference /= static_cast<double>(set.windows());
  for (int64_t per : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{37}, int64_t{64}}) {
    calls = 0;
    const double v = held_out_loss(set, per, loss);
    EXPECT_NEAR(v, reference, 1e-6 * reference) << per << " windows per forward pass";
    EXPECT_EQ(calls, (37 + std::min<int64_t>(per, 37) - 1) / std::min<int64_t>(per, 37)) << per;
  }
  EXPECT_GT(reference, 4.0);  // an untrained model over 257 tokens: about ln 257 = 5.5, not a degenerate 0
  EXPECT_THROW(held_out_loss(set, 0, loss), std::exception);
}
