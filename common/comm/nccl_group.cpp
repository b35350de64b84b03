// LocalGroup over NCCL: one communicator per local GPU, all made at once by ncclCommInitAll on
// the node's main thread; afterwards each device's thread uses only its own communicator, so no
// ncclGroupStart is needed across threads. Reduce-scatter and all-gather are ncclReduceScatter /
// ncclAllGather in place when the buffer divides into equal slices; uneven slices use grouped
// ncclReduce / ncclBroadcast (one per slice, rooted at the slice's owner), which NCCL's own
// documentation recommends for unequal parts. Abort safety: a call holds the group's lock shared
// while it enqueues on its communicator, abort() holds it exclusively, so no communicator is
// aborted (and freed by NCCL) under a call still using it. Every call is queued on the calling thread's
// current CUDA stream: ordering against computation is CommStream's job (one mechanism), not this
// group's (the bucket reducer's thread has its communication stream current and fenced; the
// training thread's calls run on the compute stream, in program order with its kernels).
#include <mutex>
#include <shared_mutex>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/check.h"
#include "common/comm/abortable_barrier.h"
#include "common/comm/local_group.h"
#include "common/comm/sharding.h"

#define SYN_NCCL(call)                                                                                             \
  do {                                                                                                             \
    ncclResult_t r_ = (call);                                                                                      \
    SYN_CHECK(r_ == ncclSuccess, fmt::format("{} failed: {}", #call, ncclGetErrorString(r_)),                      \
              "set NCCL_DEBUG=INFO for NCCL's own account; check that every GPU is visible and healthy");          \
  } while (0)

namespace syncopate {
namespace {

class NcclGroup : public LocalGroup {
 public:
  explicit NcclGroup(const std::vector<int>& devices)
      : devices_(devices), comms_(devices.size()), host_(static_cast<int>(devices.size())) {
    SYN_NCCL(ncclCommInitAll(comms_.data(), static_cast<int>(devices_.size()), devices_.data()));
  }
  // Teardown (issue 28 (2)): finalizing a communicator is an intra-node collective, and NCCL
  // requires the calls for several GPUs driven from one thread to be grouped, else the first one
  // waits for peers that are never called. Finalize every communicator in one group (it flushes
  // their pending work), then destroy them. Aborted communicators (null) are already freed.
  ~NcclGroup() override {
    ncclResult_t r = ncclGroupStart();
    for (ncclComm_t c : comms_)
      if (c && r == ncclSuccess) r = ncclCommFinalize(c);
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess || end != ncclSuccess) {  // a destructor does not throw: abort what is left
      for (ncclComm_t c : comms_)
        if (c) ncclCommAbort(c);
      return;
    }
    for (ncclComm_t c : comms_)
      if (c) ncclCommDestroy(c);
  }
  int size() const override { return static_cast<int>(devices_.size()); }
  std::string backend() const override { return "nccl"; }

  void all_reduce_sum(int rank, at::Tensor& t) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      SYN_NCCL(ncclAllReduce(p, p, static_cast<size_t>(n), ncclFloat, ncclSum, c, s));
    });
  }
  void reduce_scatter_sum(int rank, at::Tensor& t) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      if (n % size() == 0) {  // equal slices: one call, in place (recvbuff = sendbuff + rank * count)
        const size_t count = static_cast<size_t>(n / size());
        SYN_NCCL(ncclReduceScatter(p, p + static_cast<size_t>(rank) * count, count, ncclFloat, ncclSum, c, s));
        return;
      }
      SYN_NCCL(ncclGroupStart());
      for (int i = 0; i < size(); ++i) {
        const int64_t lo = Sharding::begin(n, size(), i), hi = Sharding::begin(n, size(), i + 1);
        if (hi > lo) SYN_NCCL(ncclReduce(p + lo, p + lo, static_cast<size_t>(hi - lo), ncclFloat, ncclSum, i, c, s));
      }
      SYN_NCCL(ncclGroupEnd());
    });
  }
  void all_gather(int rank, at::Tensor& t) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      if (n % size() == 0) {  // equal slices: one call, in place (sendbuff = recvbuff + rank * count)
        const size_t count = static_cast<size_t>(n / size());
        SYN_NCCL(ncclAllGather(p + static_cast<size_t>(rank) * count, p, count, ncclFloat, c, s));
        return;
      }
      SYN_NCCL(ncclGroupStart());
      for (int i = 0; i < size(); ++i) {
        const int64_t lo = Sharding::begin(n, size(), i), hi = Sharding::begin(n, size(), i + 1);
        if (hi > lo) SYN_NCCL(ncclBroadcast(p + lo, p + lo, static_cast<size_t>(hi - lo), ncclFloat, i, c, s));
      }
      SYN_NCCL(ncclGroupEnd());
    });
  }
  void reduce_sum(int rank, at::Tensor& t, int root) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      SYN_NCCL(ncclReduce(p, p, static_cast<size_t>(n), ncclFloat, ncclSum, root, c, s));
    });
  }
  void broadcast(int rank, at::Tensor& t, int root) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      SYN_NCCL(ncclBroadcast(p, p, static_cast<size_t>(n), ncclFloat, root, c, s));
    });
  }
  void barrier(int rank) override {
    c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(devices_[rank])).synchronize();  // its queued work
    host_.arrive_and_wait();  // every rank's
  }
  void abort(const std::string& why) override {
    host_.abort(why);
    std::unique_lock<std::shared_mutex> l(mu_);  // waits for calls still enqueueing on a communicator
    if (!aborted_.empty()) return;
    aborted_ = why.empty() ? "a local replica failed" : why;
    for (ncclComm_t& c : comms_) {  // wakes kernels waiting for a peer that will never come
      ncclCommAbort(c);
      c = nullptr;
    }
  }

 private:
  // Queues one NCCL call for `rank` on the calling thread's current stream of its device.
  template <class F>
  void run(int rank, at::Tensor& t, F&& call) {
    SYN_CHECK(t.is_cuda() && t.get_device() == devices_[rank] && t.scalar_type() == at::kFloat && t.is_contiguous(),
              fmt::format("an NCCL collective of local rank {} needs a contiguous float32 buffer on cuda:{}", rank,
                          devices_[rank]),
              "this is a bug");
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices_[rank]));
    std::shared_lock<std::shared_mutex> l(mu_);  // held while NCCL uses the communicator (abort waits)
    SYN_CHECK(aborted_.empty(), "local collective aborted: " + aborted_, "see the first error above");
    call(t.data_ptr<float>(), t.numel(), comms_[rank], c10::cuda::getCurrentCUDAStream().stream());
  }

  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  std::shared_mutex mu_;  // shared: a call enqueueing; exclusive: abort
  AbortableBarrier host_;  // barrier(): the ranks' threads meet once their streams are drained
  std::string aborted_;
};

}  // namespace

std::unique_ptr<LocalGroup> make_nccl_group(const std::vector<int>& devices) {
  return std::make_unique<NcclGroup>(devices);
}

}  // namespace syncopate
