#include "common/comm/comm_stream.h"

#ifdef SYNCOPATE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "common/check.h"

namespace syncopate {
namespace {

class CpuCommStream : public CommStream {
 public:
  std::shared_ptr<Fence> record_current() override { return nullptr; }
  void enter() override {}
  void wait(const Fence&) override {}
  void join_into_current() override {}
};

#ifdef SYNCOPATE_CUDA
class CudaCommStream : public CommStream {
 public:
  explicit CudaCommStream(int device)
      : device_(static_cast<c10::DeviceIndex>(device)), stream_(c10::cuda::getStreamFromPool(false, device_)) {}
  struct Event : Fence {
    mutable at::cuda::CUDAEvent e;  // CUDAEvent::block is not const
  };
  std::shared_ptr<Fence> record_current() override {
    auto f = std::make_shared<Event>();
    f->e.record(c10::cuda::getCurrentCUDAStream(device_));
    return f;
  }
  void enter() override {
    c10::cuda::set_device(device_);
    c10::cuda::setCurrentCUDAStream(stream_);
  }
  void wait(const Fence& f) override { static_cast<const Event&>(f).e.block(stream_); }
  void join_into_current() override {
    at::cuda::CUDAEvent e;
    e.record(stream_);
    e.block(c10::cuda::getCurrentCUDAStream(device_));
  }

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
};
#endif

}  // namespace

std::unique_ptr<CommStream> make_comm_stream(int device) {
  if (device < 0) return std::make_unique<CpuCommStream>();
#ifdef SYNCOPATE_CUDA
  return std::make_unique<CudaCommStream>(device);
#else
  SYN_FAIL("a GPU replica needs a build with CUDA", "rebuild where CMake finds the CUDA toolkit and a CUDA LibTorch");
#endif
}

}  // namespace syncopate
