#include "worker/train/determinism.h"

#include <ATen/Context.h>

#include <cstdlib>

namespace syncopate {

void apply_determinism(bool on) {
  if (on) ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/on);
  at::globalContext().setDeterministicCuDNN(on);
  if (on) at::globalContext().setBenchmarkCuDNN(false);
}

}  // namespace syncopate
