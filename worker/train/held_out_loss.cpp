#include "worker/train/held_out_loss.h"

#include <algorithm>

#include <ATen/ops/empty.h>

#include "common/check.h"
#include "worker/data/held_out_set.h"

namespace syncopate {

double held_out_loss(const HeldOutSet& set, int64_t per_forward, const WindowsLoss& loss) {
  SYN_CHECK(per_forward >= 1, "held_out_loss: per_forward < 1", "pass the training batch size (train.batch_size >= 1)");
  const int64_t n = set.windows(), T = set.context();
  const int64_t b = std::min(per_forward, n);
  at::Tensor xs = at::empty({b, T}, at::kLong), ys = at::empty({b, T}, at::kLong);
  double sum = 0;
  for (int64_t first = 0; first < n; first += b) {
    const int64_t count = std::min(b, n - first);
    at::Tensor x = count == b ? xs : xs.narrow(0, 0, count), y = count == b ? ys : ys.narrow(0, 0, count);
    set.fill(first, count, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    sum += loss(x, y) * static_cast<double>(count);
  }
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

}  // namespace syncopate
