// train.deterministic: LibTorch's deterministic kernels where it has them, so that two runs of the
// same configuration on the same GPU repeat bit for bit (the GPU check's noise floor is then 0 and
// its comparisons are exact), at some cost in speed. It sets LibTorch's deterministic-algorithms
// mode in warn-only form (an op with no deterministic kernel warns once instead of failing the
// run), cuDNN's deterministic mode without its autotuner, and cuBLAS's fixed workspace
// (CUBLAS_WORKSPACE_CONFIG=:4096:8, unless the environment sets it), which must be in place before
// the first cuBLAS call: apply it before any model is built. On CPU LibTorch's kernels are already
// repeatable here; the flags cost nothing there. Off: LibTorch's defaults.
#pragma once

namespace syncopate {

void apply_determinism(bool on);

}  // namespace syncopate
