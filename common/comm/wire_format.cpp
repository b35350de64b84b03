#include "common/comm/wire_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

WireFormat parse_wire_format(const std::string& name) {
  if (name == "f32") return WireFormat::kF32;
  if (name == "bf16") return WireFormat::kBf16;
  if (name == "fp16") return WireFormat::kFp16;
  if (name == "int8") return WireFormat::kInt8;
  SYN_FAIL(fmt::format("dist.wire='{}' is not a wire format", name), "use f32, bf16, fp16 or int8");
}

std::string wire_dtype(WireFormat f) {
  switch (f) {
    case WireFormat::kF32: return "f32";
    case WireFormat::kBf16: return "bf16";
    case WireFormat::kFp16: return "f16";
    case WireFormat::kInt8: return "i8";
  }
  return "f32";
}

WireFormat wire_format_of_dtype(const std::string& dtype) {
  for (WireFormat f : {WireFormat::kF32, WireFormat::kBf16, WireFormat::kFp16, WireFormat::kInt8})
    if (wire_dtype(f) == dtype) return f;
  SYN_FAIL(fmt::format("dtype '{}' is not a wire format this peer knows (f32, bf16, f16, i8)", dtype),
           "worker and server must come from the same Syncopate build");
}

size_t wire_bytes(WireFormat f, int64_t n) {
  const size_t m = static_cast<size_t>(std::max<int64_t>(n, 0));
  switch (f) {
    case WireFormat::kF32: return 4 * m;
    case WireFormat::kBf16:
    case WireFormat::kFp16: return 2 * m;
    case WireFormat::kInt8: return m + 4 * ((m + kInt8Chunk - 1) / kInt8Chunk);
  }
  return 4 * m;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half precision by hand (round to nearest even, subnormals, inf, NaN).
uint16_t to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;                  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                 // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                                       // below 2^-14: a subnormal (or 0)
    if (abs < 0x33000000u) return sign;                          // below 2^-25: rounds to 0
    const uint32_t e = abs >> 23, m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;                              // 14 - (e - 127) + 13 - 1 ... into 10 bits
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return sign | static_cast<uint16_t>(q + (rem > half || (rem == half && (q & 1u))));
  }
  uint32_t v = abs - 0x38000000u;                                // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);                                // round to nearest even at bit 13
  return sign | static_cast<uint16_t>(v >> 13);
}

float from_fp16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float f;
  if (e == 0) {
    f = std::ldexp(static_cast<float>(m), -24);  // subnormal or zero
    return sign ? -f : f;
  }
  uint32_t u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

void check_fp16_range(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    SYN_CHECK(!(std::fabs(x[i]) > 65504.0f),  // NaN compares false: it passes
              fmt::format("value {} at index {} does not fit the fp16 wire (|x| <= 65504)", x[i], i),
              "use --dist.wire=bf16 (float32's range) or f32, or lower the learning rate if values exploded");
}

namespace {
// The first non-finite value of x[0..n) named, for a format that cannot carry it.
[[noreturn]] void fail_nonfinite(const float* x, int64_t n, const char* format) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      SYN_FAIL(fmt::format("value {} at index {} cannot travel on the {} wire: it is not finite", x[i], i, format),
               "the gradient diverged: the step must be skipped (train.skip_grad_norm does), or lower the learning "
               "rate; with dist.ps_push_in_backward the push leaves before the worker's finite check");
  SYN_FAIL("a non-finite value vanished", "this is a bug");
}

// int8 with a float32 scale per kInt8Chunk values: the scales first, then one int8 per value.
// residual non-null: each value's dequantized form is subtracted from residual[i] as it is made
// (error feedback in the same pass; the decoder computes the same q * scale). A non-finite value
// is an error naming it, thrown before anything is written (int8 cannot carry it: std::max skips a
// NaN, and an Inf makes the chunk's scale Inf).
void encode_int8(const float* x, int64_t n, uint8_t* out, float* residual) {
  const int64_t chunks = (n + kInt8Chunk - 1) / kInt8Chunk;
  uint8_t* q = out + 4 * chunks;
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(x[i]);
  if (!finite) fail_nonfinite(x, n, "int8");
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kInt8Chunk, hi = std::min(n, lo + kInt8Chunk);
    float amax = 0;
    for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    std::memcpy(out + 4 * c, &scale, 4);
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    for (int64_t i = lo; i < hi; ++i) {
      const float r = std::nearbyint(std::clamp(x[i] * inv, -127.0f, 127.0f));
      const int8_t v = static_cast<int8_t>(r);
      q[i] = static_cast<uint8_t>(v);
      if (residual) residual[i] -= static_cast<float>(v) * scale;
    }
  }
}
}  // namespace

void encode(WireFormat f, const float* x, int64_t n, uint8_t* out) {
  switch (f) {
    case WireFormat::kF32:
      if (n) std::memcpy(out, x, static_cast<size_t>(n) * 4);
      return;
    case WireFormat::kBf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WireFormat::kFp16:
      check_fp16_range(x, n);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = to_fp16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WireFormat::kInt8:
      encode_int8(x, n, out, nullptr);
      return;
  }
}

void decode(WireFormat f, const uint8_t* in, size_t bytes, int64_t n, float* out) {
  SYN_CHECK(bytes == wire_bytes(f, n),
            fmt::format("{} bytes for {} values in {} (expected {})", bytes, n, wire_dtype(f), wire_bytes(f, n)),
            "sender and receiver disagree on the wire format or the range");
  switch (f) {
    case WireFormat::kF32:
      if (n) std::memcpy(out, in, static_cast<size_t>(n) * 4);
      return;
    case WireFormat::kBf16:
    case WireFormat::kFp16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        out[i] = f == WireFormat::kBf16 ? from_bf16(h) : from_fp16(h);
      }
      return;
    case WireFormat::kInt8: {
      const int64_t chunks = (n + kInt8Chunk - 1) / kInt8Chunk;
      const uint8_t* q = in + 4 * chunks;
      for (int64_t c = 0; c < chunks; ++c) {
        float scale;
        std::memcpy(&scale, in + 4 * c, 4);
        SYN_CHECK(std::isfinite(scale) && scale >= 0, fmt::format("int8 chunk {} has scale {}", c, scale),
                  "the sender is corrupt or not Syncopate's: an int8 message's scales are finite and >= 0");
        const int64_t lo = c * kInt8Chunk, hi = std::min(n, lo + kInt8Chunk);
        for (int64_t i = lo; i < hi; ++i) out[i] = static_cast<float>(static_cast<int8_t>(q[i])) * scale;
      }
      return;
    }
  }
}

ErrorFeedback::ErrorFeedback(WireFormat f, int64_t n) : f_(f), residual_(static_cast<size_t>(n), 0.0f) {}

void ErrorFeedback::encode(const float* x, uint8_t* out) {
  const int64_t n = static_cast<int64_t>(residual_.size());
  // Checked before the residual changes: a refused message leaves it as it was (a NaN kept in it
  // would be owed, and sent, forever).
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(x[i]) && std::isfinite(residual_[i] + x[i]);
  if (!finite) {
    std::vector<float> owed(residual_);
    for (int64_t i = 0; i < n; ++i) owed[i] += x[i];
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) fail_nonfinite(x, n, f_ == WireFormat::kInt8 ? "int8" : wire_dtype(f_).c_str());
    fail_nonfinite(owed.data(), n, f_ == WireFormat::kInt8 ? "int8" : wire_dtype(f_).c_str());
  }
  for (int64_t i = 0; i < n; ++i) residual_[i] += x[i];  // what is owed: this message plus the last ones' loss
  if (f_ == WireFormat::kInt8) {  // quantized and what it carries taken off the residual, in one pass
    encode_int8(residual_.data(), n, out, residual_.data());
    return;
  }
  if (sent_.size() != residual_.size()) sent_.resize(residual_.size());
  syncopate::encode(f_, residual_.data(), n, out);
  decode(f_, out, wire_bytes(f_, n), n, sent_.data());
  for (int64_t i = 0; i < n; ++i) residual_[i] -= sent_[i];
}

}  // namespace syncopate
