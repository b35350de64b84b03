// LocalGroup over NCCL: one communicator per local GPU, all made at once on the node's main
// thread; afterwards each device's thread uses only its own communicator, so no ncclGroupStart is
// needed across threads. Reduce-scatter and all-gather are ncclReduceScatter / ncclAllGather in
// place when the buffer divides into equal slices; uneven slices use grouped ncclReduce /
// ncclBroadcast (one per slice, rooted at the slice's owner), which NCCL's own documentation
// recommends for unequal parts. Every call is queued on the calling thread's current CUDA stream:
// ordering against computation is CommStream's job (one mechanism), not this group's.
//
// Abort safety (issue 28 (3), AbortableCalls): the communicators are non-blocking
// (config.blocking = 0), so no NCCL call waits inside NCCL for a peer (NCCL connects lazily at
// the first collective of each kind, and a blocking call would wait there for every local rank).
// Each call is issued and its completion polled with ncclCommGetAsyncError, the group's lock held
// shared only for each short call; abort() marks the group aborted, then aborts the
// communicators under the lock held exclusively. Asynchronous errors are read on every poll, and
// every wait (a call's completion, a device wait, the barrier) is bounded by timeout_s.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <nccl.h>

#include "common/check.h"
#include "common/comm/abortable_barrier.h"
#include "common/comm/abortable_calls.h"
#include "common/comm/local_group.h"
#include "common/comm/sharding.h"

#define SYN_NCCL(call)                                                                                             \
  do {                                                                                                             \
    ncclResult_t r_ = (call);                                                                                      \
    SYN_CHECK(r_ == ncclSuccess, fmt::format("{} failed: {}", #call, ncclGetErrorString(r_)),                      \
              "set NCCL_DEBUG=INFO for NCCL's own account; check that every GPU is visible and healthy");          \
  } while (0)
// A call on a non-blocking communicator: ncclInProgress means issued, its completion is polled.
#define SYN_NCCL_ISSUE(call)                                                                                       \
  do {                                                                                                             \
    ncclResult_t r_ = (call);                                                                                      \
    SYN_CHECK(r_ == ncclSuccess || r_ == ncclInProgress, fmt::format("{} failed: {}", #call, ncclGetErrorString(r_)), \
              "set NCCL_DEBUG=INFO for NCCL's own account; check that every GPU is visible and healthy");          \
  } while (0)

namespace syncopate {
namespace {

// ncclGroupStart ... ncclGroupEnd as a scope: a throw between them still ends the group (inside an
// open group an ncclCommAbort from this thread would only be queued, never run). end() ends it
// early and returns NCCL's result (ncclInProgress on non-blocking communicators).
class NcclGroupScope {
 public:
  NcclGroupScope() { SYN_NCCL(ncclGroupStart()); }
  ~NcclGroupScope() {
    if (open_) ncclGroupEnd();
  }
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }
  NcclGroupScope(const NcclGroupScope&) = delete;
  NcclGroupScope& operator=(const NcclGroupScope&) = delete;

 private:
  bool open_ = true;
};

class NcclGroup : public LocalGroup {
 public:
  NcclGroup(const std::vector<int>& devices, double timeout_s)
      : devices_(devices), comms_(devices.size(), nullptr), host_(static_cast<int>(devices.size()), timeout_s),
        calls_(timeout_s) {
    // ncclCommInitAll takes no config: the same clique made by hand, non-blocking, its inits in
    // one group (one thread creates the communicators of every device).
    ncclUniqueId id;
    SYN_NCCL(ncclGetUniqueId(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const int n = size();
    try {
      {
        NcclGroupScope group;  // ended (even by a throw) before any abort below
        for (int i = 0; i < n; ++i) {
          c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(devices_[i]));
          SYN_NCCL_ISSUE(ncclCommInitRankConfig(&comms_[i], n, id, i, &config));
        }
        SYN_NCCL_ISSUE(group.end());
      }
      for (int i = 0; i < n; ++i) calls_.run(fmt::format("creating the NCCL communicator of cuda:{}", devices_[i]),
                                             [&](bool) { return progress(i); });
    } catch (...) {
      for (ncclComm_t c : comms_)
        if (c) ncclCommAbort(c);
      throw;
    }
  }
  // Teardown (issue 28 (2)): finalizing a communicator is an intra-node collective, and NCCL
  // requires the calls for several GPUs driven from one thread to be grouped, else the first one
  // waits for peers that are never called. Finalize every communicator in one group (it flushes
  // their pending work; non-blocking, so each is polled until quiescent, bounded), then destroy
  // them. Aborted communicators (null) are already freed; a failed or late finalize aborts.
  ~NcclGroup() override {
    if (calls_.aborted()) return;
    // Only quiescent communicators are finalized (a finalize on one still in progress or in error
    // fails, and the group would drop the others' finalizes): else abort them all.
    bool ok = true;
    for (ncclComm_t c : comms_) {
      ncclResult_t state = ncclInProgress;
      ok = ok && ncclCommGetAsyncError(c, &state) == ncclSuccess && state == ncclSuccess;
    }
    ok = ok && ncclGroupStart() == ncclSuccess;
    for (ncclComm_t c : comms_) {
      const ncclResult_t r = ok ? ncclCommFinalize(c) : ncclSuccess;
      ok = ok && (r == ncclSuccess || r == ncclInProgress);
    }
    const ncclResult_t end = ncclGroupEnd();
    ok = ok && (end == ncclSuccess || end == ncclInProgress);
    try {
      for (int i = 0; ok && i < size(); ++i)
        calls_.run(fmt::format("finalizing the NCCL communicator of cuda:{}", devices_[i]), [&](bool) { return progress(i); });
    } catch (const std::exception&) {  // a destructor does not throw
      ok = false;
    }
    for (ncclComm_t c : comms_) ok ? ncclCommDestroy(c) : ncclCommAbort(c);
  }
  int size() const override { return static_cast<int>(devices_.size()); }
  std::string backend() const override { return "nccl"; }

  void all_reduce_sum(int rank, at::Tensor& t) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      SYN_NCCL_ISSUE(ncclAllReduce(p, p, static_cast<size_t>(n), ncclFloat, ncclSum, c, s));
    });
  }
  void reduce_scatter_sum(int rank, at::Tensor& t) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      if (n % size() == 0) {  // equal slices: one call, in place (recvbuff = sendbuff + rank * count)
        const size_t count = static_cast<size_t>(n / size());
        SYN_NCCL_ISSUE(ncclReduceScatter(p, p + static_cast<size_t>(rank) * count, count, ncclFloat, ncclSum, c, s));
        return;
      }
      NcclGroupScope group;
      for (int i = 0; i < size(); ++i) {
        const int64_t lo = Sharding::begin(n, size(), i), hi = Sharding::begin(n, size(), i + 1);
        if (hi > lo) SYN_NCCL_ISSUE(ncclReduce(p + lo, p + lo, static_cast<size_t>(hi - lo), ncclFloat, ncclSum, i, c, s));
      }
      SYN_NCCL_ISSUE(group.end());
    });
  }
  void all_gather(int rank, at::Tensor& t) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      if (n % size() == 0) {  // equal slices: one call, in place (sendbuff = recvbuff + rank * count)
        const size_t count = static_cast<size_t>(n / size());
        SYN_NCCL_ISSUE(ncclAllGather(p + static_cast<size_t>(rank) * count, p, count, ncclFloat, c, s));
        return;
      }
      NcclGroupScope group;
      for (int i = 0; i < size(); ++i) {
        const int64_t lo = Sharding::begin(n, size(), i), hi = Sharding::begin(n, size(), i + 1);
        if (hi > lo) SYN_NCCL_ISSUE(ncclBroadcast(p + lo, p + lo, static_cast<size_t>(hi - lo), ncclFloat, i, c, s));
      }
      SYN_NCCL_ISSUE(group.end());
    });
  }
  void reduce_sum(int rank, at::Tensor& t, int root) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      SYN_NCCL_ISSUE(ncclReduce(p, p, static_cast<size_t>(n), ncclFloat, ncclSum, root, c, s));
    });
  }
  void broadcast(int rank, at::Tensor& t, int root) override {
    run(rank, t, [&](float* p, int64_t n, ncclComm_t c, cudaStream_t s) {
      SYN_NCCL_ISSUE(ncclBroadcast(p, p, static_cast<size_t>(n), ncclFloat, root, c, s));
    });
  }
  void barrier(int rank) override {
    wait_device(rank, "a barrier");  // its queued work
    host_.arrive_and_wait();         // every rank's
  }
  // An event on the current stream, polled (bounded, abortable), the communicator's asynchronous
  // error read on every poll: a kernel waiting for a peer that died is reported, not waited on.
  void wait_device(int rank, const std::string& what) override {
    const auto dev = static_cast<c10::DeviceIndex>(devices_[rank]);
    c10::cuda::CUDAGuard guard(dev);
    at::cuda::CUDAEvent done;
    done.record(c10::cuda::getCurrentCUDAStream(dev));
    calls_.run(fmt::format("{} on cuda:{} (local rank {})", what, devices_[rank], rank), [&](bool) {
      if (progress(rank) == AbortableCalls::Progress::kPending) return AbortableCalls::Progress::kPending;
      return done.query() ? AbortableCalls::Progress::kDone : AbortableCalls::Progress::kPending;
    });
  }
  void abort(const std::string& why) override {
    host_.abort(why);
    calls_.abort(why, [&] {  // no call is using a communicator now; kernels waiting for a peer are woken
      for (ncclComm_t& c : comms_) {
        if (c) ncclCommAbort(c);
        c = nullptr;
      }
    });
  }

 private:
  // Rank `rank`'s communicator: done, or its last call still in progress (non-blocking); an
  // asynchronous error (a peer's failure, a network or CUDA error inside NCCL) is thrown, named.
  // Called inside AbortableCalls::run, under its lock.
  AbortableCalls::Progress progress(int rank) {
    ncclResult_t state = ncclSuccess;
    SYN_NCCL(ncclCommGetAsyncError(comms_[rank], &state));
    if (state == ncclInProgress) return AbortableCalls::Progress::kPending;
    SYN_CHECK(state == ncclSuccess,
              fmt::format("NCCL reported an asynchronous error on cuda:{}: {} ({})", devices_[rank],
                          ncclGetErrorString(state), ncclGetLastError(comms_[rank])),
              "set NCCL_DEBUG=INFO for NCCL's own account; see the other replicas' errors above");
    return AbortableCalls::Progress::kDone;
  }
  // Issues one NCCL call for `rank` on the calling thread's current stream of its device, then
  // polls it until NCCL has queued it (bounded, abortable).
  template <class F>
  void run(int rank, at::Tensor& t, F&& call) {
    SYN_CHECK(t.is_cuda() && t.get_device() == devices_[rank] && t.scalar_type() == at::kFloat && t.is_contiguous(),
              fmt::format("an NCCL collective of local rank {} needs a contiguous float32 buffer on cuda:{}", rank,
                          devices_[rank]),
              "this is a bug");
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(devices_[rank]));
    calls_.run(fmt::format("a collective of local rank {} (cuda:{})", rank, devices_[rank]), [&](bool first) {
      if (first) call(t.data_ptr<float>(), t.numel(), comms_[rank], c10::cuda::getCurrentCUDAStream().stream());
      return progress(rank);
    });
  }

  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
  AbortableBarrier host_;  // barrier(): the ranks' threads meet once their streams are drained
  AbortableCalls calls_;   // every NCCL call and device wait: bounded, and abortable from any thread
};

}  // namespace

std::unique_ptr<LocalGroup> make_nccl_group(const std::vector<int>& devices, double timeout_s) {
  return std::make_unique<NcclGroup>(devices, timeout_s);
}

}  // namespace syncopate
