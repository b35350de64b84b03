// Wire formats (common/comm/wire_format.*): conversions against c10's, round-trip error bounds
// per format, fp16's range check, int8's error feedback, the ring's fp16 wire, and parameter
// servers that take compressed pushes and refuse mixed formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/check.h"
#include "common/comm/ring_allreduce.h"
#include "common/comm/transport/memory_connection.h"
#include "common/comm/wire_format.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {
std::vector<float> random_values(size_t n, unsigned seed) {  // mixed signs, magnitudes 2^-30 .. 2^15, some exact ties
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(-30, 15), sign(0, 1);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (sign(g) ? -1.0f : 1.0f) * std::ldexp(m(g), e(g));
  v[0] = 0.0f, v[1] = -0.0f, v[2] = 1.0f + 3.0f / 256.0f /* bf16 tie */, v[3] = 1.0f + 3.0f / 2048.0f /* fp16 tie */;
  v[4] = 65504.0f, v[5] = std::ldexp(1.0f, -24) /* fp16's smallest subnormal */, v[6] = std::ldexp(3.0f, -26);
  return v;
}
std::vector<float> round_trip(WireFormat f, const std::vector<float>& x) {
  std::vector<uint8_t> b(wire_bytes(f, static_cast<int64_t>(x.size())));
  encode(f, x.data(), static_cast<int64_t>(x.size()), b.data());
  std::vector<float> y(x.size());
  decode(f, b.data(), b.size(), static_cast<int64_t>(x.size()), y.data());
  return y;
}
}  // namespace

// Both 16-bit conversions round to nearest even exactly as c10's do, subnormals, ties and the
// fp16 range edge included.
TEST(WireFormat, SixteenBitConversionsEqualC10s) {
  const auto v = random_values(200000, 1);
  for (float x : v) {
    ASSERT_EQ(to_bf16(x), c10::BFloat16(x).x) << x;
    if (std::fabs(x) <= 65504.0f) ASSERT_EQ(to_fp16(x), c10::Half(x).x) << x;
    ASSERT_EQ(from_bf16(to_bf16(x)), static_cast<float>(c10::BFloat16(x))) << x;
    if (std::fabs(x) <= 65504.0f) ASSERT_EQ(from_fp16(to_fp16(x)), static_cast<float>(c10::Half(x))) << x;
  }
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 3.0f / 256.0f)), 1.015625f);  // the tie goes to even
  EXPECT_TRUE(std::isnan(from_fp16(to_fp16(NAN))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(NAN))));
}

// Per element: bf16 within 2^-8 |x| (8 significant bits: unit roundoff 2^-8), fp16 within 2^-11 |x|
// for normal values and 2^-25 absolute below them, int8 within half a step of its chunk's scale.
TEST(WireFormat, RoundTripErrorsAreWithinEachFormatsBound) {
  const auto v = random_values(3 * kInt8Chunk + 17, 2);
  std::vector<float> in_range = v;  // fp16 takes |x| <= 65504 only (beyond is an error, tested below)
  for (float& x : in_range) x = std::clamp(x, -65504.0f, 65504.0f);
  const auto b = round_trip(WireFormat::kBf16, v), h = round_trip(WireFormat::kFp16, in_range);
  const auto q = round_trip(WireFormat::kInt8, v), f = round_trip(WireFormat::kF32, v);
  EXPECT_EQ(f, v);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_LE(std::fabs(b[i] - v[i]), std::ldexp(std::fabs(v[i]), -8)) << i << " " << v[i];
    const float x = in_range[i];
    if (std::fabs(x) >= std::ldexp(1.0f, -14)) EXPECT_LE(std::fabs(h[i] - x), std::ldexp(std::fabs(x), -11)) << x;
    else EXPECT_LE(std::fabs(h[i] - x), std::ldexp(1.0f, -25)) << x;
  }
  for (size_t c = 0; c * kInt8Chunk < v.size(); ++c) {
    const size_t lo = c * kInt8Chunk, hi = std::min(v.size(), lo + kInt8Chunk);
    float amax = 0;
    for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(v[i]));
    for (size_t i = lo; i < hi; ++i) EXPECT_LE(std::fabs(q[i] - v[i]), amax / 127.0f * 0.5f * 1.0001f) << i;
  }
  EXPECT_EQ(wire_bytes(WireFormat::kInt8, v.size()), v.size() + 4 * 4);  // a scale per chunk
  EXPECT_EQ(wire_bytes(WireFormat::kBf16, 10), 20u);
}

TEST(WireFormat, Fp16OutOfRangeAndBadInputAreErrorsNamingThem) {
  std::vector<float> x = {1.0f, -70000.0f};
  std::vector<uint8_t> out(4);
  const std::string e = test::error_of([&] { encode(WireFormat::kFp16, x.data(), 2, out.data()); });
  EXPECT_NE(e.find("value -70000 at index 1 does not fit the fp16 wire"), std::string::npos) << e;
  EXPECT_NE(e.find("--dist.wire=bf16"), std::string::npos) << e;
  std::vector<float> y(2);
  EXPECT_NE(test::error_of([&] { decode(WireFormat::kFp16, out.data(), 3, 2, y.data()); }).find("3 bytes for 2 values in f16"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { wire_format_of_dtype("q4"); }).find("dtype 'q4' is not a wire format"), std::string::npos);
  EXPECT_NE(test::error_of([] { parse_wire_format("fp8"); }).find("use f32, bf16, fp16 or int8"), std::string::npos);
}

// Error feedback carries what int8 rounding dropped into the next message: small values next to a
// large one in the same chunk round to 0 every time, so plain int8 never sends them; with error
// feedback the sum of what was sent tracks the sum of the true values within one rounding step,
// however many messages.
TEST(WireFormat, ErrorFeedbackMakesTheSumOfSentValuesTrackTheTrueSum) {
  const int64_t n = 100;
  std::vector<float> x(n, 0.3f);
  x[0] = 127.0f;  // scale 1: 0.3 rounds to 0
  ErrorFeedback ef(WireFormat::kInt8, n);
  std::vector<uint8_t> b(wire_bytes(WireFormat::kInt8, n));
  std::vector<double> sent(n, 0.0), plain(n, 0.0), truth(n, 0.0);
  std::vector<float> y(n);
  for (int t = 0; t < 1000; ++t) {
    ef.encode(x.data(), b.data());
    decode(WireFormat::kInt8, b.data(), b.size(), n, y.data());
    for (int64_t i = 0; i < n; ++i) sent[i] += y[i], truth[i] += x[i];
    const auto p = round_trip(WireFormat::kInt8, x);
    for (int64_t i = 0; i < n; ++i) plain[i] += p[i];
  }
  for (int64_t i = 1; i < n; ++i) {
    EXPECT_NEAR(sent[i], truth[i], 1.0) << i;  // 300 sent over 1000 messages, within one step
    EXPECT_EQ(plain[i], 0.0) << i;             // without feedback: nothing, ever
    EXPECT_NEAR(sent[i] + ef.residual()[i], truth[i], 1e-2) << i;  // nothing lost: sent + owed = true
  }
  // The residual is taken in the encoding pass (int8) or from a decode (the other formats): either
  // way exactly what was owed minus what the receiver decodes, over several chunks.
  for (WireFormat f : {WireFormat::kInt8, WireFormat::kBf16, WireFormat::kFp16}) {
    const int64_t m = 3 * kInt8Chunk + 17;
    std::vector<float> v(m);
    for (int64_t i = 0; i < m; ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + static_cast<float>(i % 97));
    ErrorFeedback e(f, m);
    std::vector<uint8_t> wire(wire_bytes(f, m));
    std::vector<float> got(m);
    for (int t = 0; t < 3; ++t) {
      std::vector<float> owed = e.residual();
      for (int64_t i = 0; i < m; ++i) owed[i] += v[i];
      e.encode(v.data(), wire.data());
      decode(f, wire.data(), wire.size(), m, got.data());
      for (int64_t i = 0; i < m; ++i) ASSERT_EQ(e.residual()[i], owed[i] - got[i]) << wire_dtype(f) << " " << i;
    }
  }
}

// The ring's fp16 wire: sums within fp16's bound, every rank identical; a partial sum beyond fp16's
// range fails by name instead of sending inf.
TEST(RingAllreduce, Fp16WireSumsWithinItsBoundAndRefusesOverflow) {
  const int world = 3;
  const size_t n = 10007;
  std::vector<std::vector<float>> v(world);
  std::vector<double> exact(n, 0.0), mass(n, 0.0);
  for (int r = 0; r < world; ++r) {
    std::mt19937 g(r + 5);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    v[r].resize(n);
    for (size_t i = 0; i < n; ++i) exact[i] += (v[r][i] = d(g)), mass[i] += std::fabs(v[r][i]);
  }
  RingAllreduceOptions opt;
  opt.wire = WireFormat::kFp16;
  opt.segment_bytes = 4096;
  test::run_memory_ring(world, [&](int r, Connection& next, Connection& prev) {
    ring_allreduce_sum(v[r].data(), n, r, world, next, prev, opt);
  });
  for (int r = 1; r < world; ++r) ASSERT_EQ(v[r], v[0]);
  for (size_t i = 0; i < n; ++i) ASSERT_LE(std::fabs(v[0][i] - exact[i]), world * std::ldexp(1.0, -11) * mass[i] + 1e-7) << i;
  // Over TCP with a short timeout: the rank whose send fails stops, and its peer's wait ends too.
  std::vector<std::vector<float>> big = {{40000.0f, 40000.0f}, {40000.0f, 40000.0f}};
  std::vector<std::string> errors(2);
  auto rings = test::tcp_ring(2, {}, 5);
  std::vector<std::future<void>> fs;
  for (int r = 0; r < 2; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      errors[static_cast<size_t>(r)] = test::error_of([&] {
        ring_allreduce_sum(big[r].data(), 2, r, 2, *rings[r].next, *rings[r].prev, opt);
      });
    }));
  for (auto& f : fs) f.get();
  EXPECT_TRUE(errors[0].find("does not fit the fp16 wire") != std::string::npos ||
              errors[1].find("does not fit the fp16 wire") != std::string::npos)
      << errors[0] << " | " << errors[1];
  opt.wire = WireFormat::kInt8;
  std::vector<std::vector<float>> w = {{1.0f}, {1.0f}};
  std::vector<std::string> e8(2);
  test::run_memory_ring(2, [&](int r, Connection& next, Connection& prev) {
    e8[static_cast<size_t>(r)] = test::error_of([&] { ring_allreduce_sum(w[r].data(), 1, r, 2, next, prev, opt); });
  });
  EXPECT_NE(e8[0].find("int8 is not a wire format of the ring"), std::string::npos) << e8[0];
}

// Issue 26 (2): int8 took a chunk's maximum with std::max (which skips NaN) and wrote a NaN as 0,
// so the server decoded a finite 0 and its finite check never fired, while the error-feedback
// residual stayed NaN (that element sent as 0 forever); an Inf made the chunk's scale Inf. A
// non-finite value is now an error naming it, before anything (the residual included) changes.
TEST(WireFormat, Int8RefusesNonFiniteValuesByNameAndKeepsTheResidualClean) {
  const int64_t n = 3 * kInt8Chunk + 5;
  std::vector<float> x = random_values(static_cast<size_t>(n), 7);
  for (float& v : x) v = std::clamp(v, -100.0f, 100.0f);
  std::vector<uint8_t> out(wire_bytes(WireFormat::kInt8, n));
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> y = x;
    y[kInt8Chunk + 17] = bad;
    std::string e = test::error_of([&] { encode(WireFormat::kInt8, y.data(), n, out.data()); });
    EXPECT_NE(e.find(fmt::format("index {}", kInt8Chunk + 17)), std::string::npos) << "encoded " << bad << " as a number: " << e;
    EXPECT_NE(e.find("int8"), std::string::npos) << e;
    ErrorFeedback fb(WireFormat::kInt8, n);
    fb.encode(x.data(), out.data());  // a residual of rounding errors
    const std::vector<float> before = fb.residual();
    e = test::error_of([&] { fb.encode(y.data(), out.data()); });
    EXPECT_NE(e.find(fmt::format("index {}", kInt8Chunk + 17)), std::string::npos) << e;
    EXPECT_EQ(fb.residual(), before) << "a refused push changed the residual";
    // The next finite push goes out as if the refused one had never been made.
    std::vector<uint8_t> a(out.size()), b(out.size());
    ErrorFeedback twin(WireFormat::kInt8, n);
    twin.encode(x.data(), a.data());
    twin.encode(x.data(), a.data());
    fb.encode(x.data(), b.data());
    EXPECT_EQ(a, b);
  }
  // A receiver refuses a message whose scale is not finite (a hostile or corrupt sender).
  encode(WireFormat::kInt8, x.data(), n, out.data());
  const float inf = INFINITY;
  std::memcpy(out.data() + 4, &inf, 4);  // chunk 1's scale
  std::vector<float> back(static_cast<size_t>(n));
  const std::string e = test::error_of([&] { decode(WireFormat::kInt8, out.data(), out.size(), n, back.data()); });
  EXPECT_NE(e.find("scale"), std::string::npos) << "decoded an infinite scale: " << e;
}
