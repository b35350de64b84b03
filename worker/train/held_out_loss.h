// The validation loss of a model over a held-out set (HeldOutSet): the mean loss per predicted
// token over every window, scored `per_forward` windows at a time. The trainer and the simulator
// both score through it, so that a run is evaluated alike on either backend.
//
// Every window has the same context, so the mean over the set is the count-weighted mean of the
// forward passes' own means: per_forward changes only the rounding (about 1e-7 relative), not the
// value. A forward pass of many windows costs the same arithmetic with far fewer dispatches (the
// `micro` model's 512-window evaluation: 8 passes of 64 windows instead of 256 of the training
// batch's 2), docs/PERFORMANCE.md.
#pragma once
#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

namespace syncopate {

class HeldOutSet;

// Tokens per forward pass of an evaluation (no gradients kept: the logits, [tokens, vocab] floats,
// dominate its memory: 0.8 GB for the GPT-2 vocabulary).
constexpr int64_t kEvalTokensPerForward = 4096;

// Windows per forward pass for a context of block_size tokens: kEvalTokensPerForward of them, and at
// least the training batch (whose forward pass the run holds memory for anyway).
int64_t eval_windows_per_forward(int64_t batch_size, int64_t block_size);

// loss(x, y): the mean loss per token of the windows x, y ([count, context] int64 ids on the CPU).
using WindowsLoss = std::function<double(const at::Tensor& x, const at::Tensor& y)>;

// The mean loss per token over all of `set`'s windows, per_forward (>= 1) of them per call of loss.
double held_out_loss(const HeldOutSet& set, int64_t per_forward, const WindowsLoss& loss);

}  // namespace syncopate
