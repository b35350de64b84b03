#include "common/comm/host_staging.h"

#include <ATen/ATen.h>

#include "common/check.h"

namespace syncopate {

namespace {
const at::Tensor& checked(const at::Tensor& t) {
  SYN_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "host staging needs a contiguous float32 buffer",
            "this is a bug");
  return t;
}
}  // namespace

at::Tensor HostStaging::own(const at::Tensor& like) {
  if (!buffer_.defined() || buffer_.numel() < like.numel())  // pinned for DMA from a GPU; grown, never shrunk
    buffer_ = at::empty({like.numel()}, at::TensorOptions().dtype(at::kFloat).pinned_memory(!like.is_cpu()));
  return buffer_.slice(0, 0, like.numel()).view(like.sizes());
}

at::Tensor HostStaging::for_(const at::Tensor& like) { return checked(like).is_cpu() ? like : own(like); }

at::Tensor HostStaging::copy_of(const at::Tensor& t) { return own(checked(t)).copy_(t); }

at::Tensor HostStaging::to_host(const at::Tensor& t) {
  at::Tensor h = for_(t);
  if (!t.is_cpu()) h.copy_(t);
  return h;
}

void HostStaging::to_device(at::Tensor& t, const at::Tensor& host) {
  if (t.data_ptr() != host.data_ptr()) t.copy_(host);
}

int64_t HostStaging::capacity() const { return buffer_.defined() ? buffer_.numel() : 0; }

}  // namespace syncopate
