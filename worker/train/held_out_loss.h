// The validation loss of a model over a held-out set (HeldOutSet): the mean loss per predicted
// token over every window, scored `per_forward` windows at a time. The trainer and the simulator
// both score through it, so that a run is evaluated alike on either backend.
//
// Every window has the same context, so the mean over the set is the count-weighted mean of the
// forward passes' own means: per_forward changes only the rounding (about 1e-7 relative), not the
// value. Both pass the training batch (whose forward pass the run holds memory for anyway): 64
// windows per pass of the `micro` model were measured no faster on the CPU (docs/PERFORMANCE.md,
// "Evaluation in larger forward passes"), so the runs' values stay those of earlier builds.
#pragma once
#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace syncopate {

class HeldOutSet;

// loss(x, y): the mean loss per token of the windows x, y ([count, context] int64 ids on the CPU).
using WindowsLoss = std::function<double(const at::Tensor& x, const at::Tensor& y)>;

// The mean loss per token over all of `set`'s windows, per_forward (>= 1) of them per call of loss.
double held_out_loss(const HeldOutSet& set, int64_t per_forward, const WindowsLoss& loss);

}  // namespace syncopate
