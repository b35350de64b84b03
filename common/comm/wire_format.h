// Wire formats for gradients and pseudo-gradients (dist.wire): how float32 values travel.
//   f32   4 bytes per value, exact
//   bf16  2 bytes, round to nearest even (8 significant bits: <= 2^-8 relative per rounding)
//   fp16  2 bytes, round to nearest even (11 significant bits: <= 2^-11), range +-65504: a value beyond it
//         is an error naming it (fp16 never saturates silently)
//   int8  1 byte per value + one float32 scale per chunk of kInt8Chunk values (scale = the
//         chunk's max |x| / 127, values rounded to nearest); meant for error feedback
//         (ErrorFeedback), which carries what rounding dropped into the next message. A NaN or
//         Inf is an error naming it (int8 cannot carry one); decode refuses a non-finite scale
// The parameter-server protocol names them by dtype ("f32", "bf16", "f16", "i8"); the ring sends
// f32, bf16 or fp16. No torch here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace syncopate {

enum class WireFormat { kF32, kBf16, kFp16, kInt8 };
constexpr int64_t kInt8Chunk = 4096;

// "f32", "bf16", "fp16", "int8" (dist.wire); anything else is an error naming the choices.
WireFormat parse_wire_format(const std::string& name);
// The protocol's dtype of a format, and back (an unknown dtype is an error naming it).
std::string wire_dtype(WireFormat f);
WireFormat wire_format_of_dtype(const std::string& dtype);
// Bytes of n values in format f.
size_t wire_bytes(WireFormat f, int64_t n);

uint16_t to_bf16(float f);  // round to nearest even
float from_bf16(uint16_t h);
uint16_t to_fp16(float f);  // round to nearest even; |f| > 65504 gives inf (encode() refuses it first)
float from_fp16(uint16_t h);

// Throws syncopate::Error naming the first of x[0..n) beyond fp16's range (NaN passes: the
// receiver's finite check names it).
void check_fp16_range(const float* x, int64_t n);
// out: wire_bytes(f, n) bytes. fp16 throws syncopate::Error naming the first value out of range.
void encode(WireFormat f, const float* x, int64_t n, uint8_t* out);
// in: exactly wire_bytes(f, n) bytes (else syncopate::Error); out: n values.
void decode(WireFormat f, const uint8_t* in, size_t bytes, int64_t n, float* out);

// Sender-side error feedback: each message encodes x + residual, and the residual becomes what
// that encoding dropped, so the sum of what was sent tracks the sum of the true values (Seide et
// al. 2014, 1-bit SGD; Karimireddy et al. 2019). One per stream of same-sized messages.
class ErrorFeedback {
 public:
  ErrorFeedback(WireFormat f, int64_t n);
  // Encodes x (n values) plus the carried residual into out (wire_bytes(f, n)) and keeps the new residual.
  // A non-finite value (of x, or of x plus the residual) throws syncopate::Error naming it, before the
  // residual changes.
  void encode(const float* x, uint8_t* out);
  const std::vector<float>& residual() const { return residual_; }
  std::vector<float>& residual() { return residual_; }  // checkpointed with the sender's state

 private:
  WireFormat f_;
  std::vector<float> residual_;
  std::vector<float> sent_;  // formats other than int8: the decoded message (int8 subtracts in its encoding pass)
};

}  // namespace syncopate
