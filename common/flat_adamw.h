// AdamW over flat fp32 buffers: the one update rule of every mode (single process, ring,
// parameter-server shards), so that all of them apply bit-for-bit the same arithmetic.
//
// Per element i, at step t (1-based), learning rate lr:
//   p_i <- p_i * (1 - lr * wd)            (only where decay applies: 2-D weights, not biases/LayerNorm)
//   m_i <- b1 * m_i + (1 - b1) * g_i
//   v_i <- b2 * v_i + (1 - b2) * g_i^2
//   p_i <- p_i - lr / (1 - b1^t) * m_i / (sqrt(v_i) / sqrt(1 - b2^t) + eps)
// which is torch.optim.AdamW's default (non-amsgrad) algorithm.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace syncopate {

struct AdamWConfig {
  double lr = 6e-4;            // peak learning rate (the schedule scales it per step)
  double beta1 = 0.9;          // first-moment decay
  double beta2 = 0.95;         // second-moment decay
  double eps = 1e-8;           // denominator epsilon
  double weight_decay = 0.1;   // decoupled weight decay, applied to 2-D weights only
  double grad_clip = 1.0;      // max global L2 norm of the gradient; 0 disables clipping

  template <class V>
  void fields(V& v) {
    v("lr", lr, "peak learning rate", 0.0, 10.0);
    v("beta1", beta1, "Adam first-moment decay", 0.0, 0.999999);
    v("beta2", beta2, "Adam second-moment decay", 0.0, 0.999999);
    v("eps", eps, "Adam epsilon", 0.0, 1.0);
    v("weight_decay", weight_decay, "decoupled weight decay on 2-D weights (embeddings, matmuls)", 0.0, 10.0);
    v("grad_clip", grad_clip, "clip the gradient's global L2 norm to this; 0 = off", 0.0, 1e9);
  }
};

class FlatAdamW {
 public:
  // numel: length of the flat parameter buffer this optimizer serves.
  // decay_ranges: [offset, length) ranges of that buffer that get weight decay.
  FlatAdamW(const AdamWConfig& cfg, int64_t numel, std::vector<std::pair<int64_t, int64_t>> decay_ranges,
            const at::TensorOptions& options);

  // One update of `params` (1-D, fp32) with gradient `grads` at learning rate lr.
  void step(at::Tensor& params, const at::Tensor& grads, double lr);

  int64_t steps() const { return step_; }
  // State for checkpoints: first and second moments and the step count.
  at::Tensor& exp_avg() { return m_; }
  at::Tensor& exp_avg_sq() { return v_; }
  void set_steps(int64_t s) { step_ = s; }

 private:
  AdamWConfig cfg_;
  std::vector<std::pair<int64_t, int64_t>> decay_;
  at::Tensor m_, v_, denom_;
  int64_t step_ = 0;
};

// Scales `grads` in place so that its global L2 norm is at most max_norm (if max_norm > 0).
// Returns the norm before clipping.
double clip_grad_norm(at::Tensor& grads, double max_norm);

}  // namespace syncopate
