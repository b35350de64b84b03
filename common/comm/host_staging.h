// The one owner of host copies of device buffers. Communication that runs on the CPU (the TCP
// ring, the parameter-server client) reads and writes host memory; a GPU replica's buffers go
// through a staging buffer that is pinned (so copies are DMA transfers) and reused by every later
// call, grown only when a larger request comes. A host tensor needs no staging and is used as is.
#pragma once
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace syncopate {

class HostStaging {
 public:
  // Host memory for `like` (a contiguous float32 buffer): `like` itself when it lives in host
  // memory, else the first like.numel() elements of this staging buffer (contents undefined).
  at::Tensor for_(const at::Tensor& like);
  // for_(t) holding t's values (copied from the device when t is on one; waits for the work
  // queued on the current stream).
  at::Tensor to_host(const at::Tensor& t);
  // A copy of t's values in this staging's own memory, even when t lives in host memory (pinned
  // when t is on a GPU): for data that must outlive changes to t (a round trip in flight).
  at::Tensor copy_of(const at::Tensor& t);
  // Writes `host` (from for_ or to_host) back into `t` when they are different memory.
  static void to_device(at::Tensor& t, const at::Tensor& host);
  int64_t capacity() const;  // elements currently held (0 until a device buffer was staged)

 private:
  at::Tensor own(const at::Tensor& like);  // this staging's memory for `like`, contents undefined
  at::Tensor buffer_;
};

}  // namespace syncopate
