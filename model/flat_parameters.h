// Moves every parameter of a module into one flat fp32 buffer, and every gradient into another:
// afterwards each parameter and its .grad are views into those buffers. Optimizers, reducers
// and parameter-server pushes then work on two contiguous tensors instead of hundreds.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn { class Module; }

namespace syncopate {

class FlatParameters {
 public:
  struct Segment {
    std::string name;            // parameter name, e.g. "h.0.attn.c_attn.weight"
    int64_t offset = 0, numel = 0;  // range in the flat buffers, elements
    std::vector<int64_t> shape;
    bool decay = false;          // true for 2-D weights (embeddings, matmuls)
  };

  // Registration order is kept: segment i is the module's i-th parameter.
  explicit FlatParameters(torch::nn::Module& module);

  at::Tensor params;  // [numel] fp32, parameters' storage
  at::Tensor grads;   // [numel] fp32, gradients' storage (accumulated in place by autograd)
  std::vector<Segment> segments;

  int64_t numel() const { return params.numel(); }
  std::vector<std::pair<int64_t, int64_t>> decay_ranges() const;  // merged [offset, length)
  void zero_grad() { grads.zero_(); }
};

}  // namespace syncopate
