// The compute precision a replica runs at, from train.precision and what its device can do.
#pragma once
#include <string>

namespace syncopate {

struct PrecisionChoice {
  bool bf16 = false;  // bf16 autocast (weights, optimizer and gradients' reduction stay fp32)
  std::string note;   // why the request was not followed as given (logged once), or empty
};

// requested: train.precision ("auto", "fp32", "bf16"); cuda: the replica is on a CUDA device;
// capability: its compute capability as major * 10 + minor (-1 unknown). bf16 tensor cores exist
// from 8.0 (Ampere): below it, or unknown, bf16 falls back to fp32 with a note (not emulated at a
// fraction of the speed). "bf16" on CPU is refused by the caller (validate).
inline PrecisionChoice choose_precision(const std::string& requested, bool cuda, int capability) {
  if (!cuda || requested == "fp32") return {};
  if (capability >= 80) return {true, ""};
  const std::string cap = capability < 0 ? "unknown" : std::to_string(capability / 10) + "." + std::to_string(capability % 10);
  return {false, "train.precision=" + requested + ": this GPU's compute capability is " + cap +
                     " and bf16 needs 8.0 (Ampere) or newer; training in fp32 instead (set train.precision=fp32 to "
                     "silence this)"};
}

}  // namespace syncopate
