#include "worker/data/held_out_set.h"

#include <vector>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

HeldOutSet::HeldOutSet(const TokenStream& val, int64_t context, int64_t windows, uint64_t seed, int64_t vocab_limit)
    : sampler_(val, context, seed, vocab_limit), context_(context), windows_(windows) {
  SYN_CHECK(windows >= 1, fmt::format("a held-out set of {} windows", windows), "set eval.val_windows >= 1");
  SYN_CHECK(windows <= sampler_.windows(),
            fmt::format("eval.val_windows={} but the validation split '{}' holds only {} windows of {} tokens",
                        windows, val.path(), sampler_.windows(), context + 1),
            fmt::format("lower eval.val_windows to at most {}, or hold out more text (data.val_fraction, or a larger "
                        "data.val_file)", sampler_.windows()));
  // FNV-1a over (context, every window's ids): the same digest means the same tokens in the same order.
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
  };
  mix(static_cast<uint64_t>(context));
  std::vector<int64_t> x(static_cast<size_t>(context)), y(static_cast<size_t>(context));
  for (int64_t w = 0; w < windows; ++w) {
    sampler_.fill(w, 1, x.data(), y.data());
    for (int64_t t = 0; t < context; ++t) mix(static_cast<uint64_t>(x[static_cast<size_t>(t)]));
    mix(static_cast<uint64_t>(y.back()));
  }
  digest_ = fmt::format("{:016x}", h);
}

void HeldOutSet::fill(int64_t first, int64_t count, int64_t* x, int64_t* y) const {
  SYN_CHECK(first >= 0 && first + count <= windows_,
            fmt::format("held-out windows [{}, {}) of a set of {}", first, first + count, windows_),
            "an evaluation reads inside its set (a bug: report it)");
  sampler_.fill(first, count, x, y);
}

}  // namespace syncopate
