#include "common/comm/local_group.h"


#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/comm/abortable_barrier.h"

namespace syncopate {
namespace {

// CPU replicas in threads of one process: each collective is "publish the buffer, meet, work on
// the own slice of everyone's buffers, meet again". A rank only ever writes its own buffer, and
// between two meetings no two ranks touch the same slice, so no further locking is needed. Slice
// i is summed by rank i alone, in a fixed order, and copied to the others: every rank ends with
// the same bits.
class ThreadGroup : public LocalGroup {
 public:
  ThreadGroup(int n, double timeout_s) : n_(n), bufs_(static_cast<size_t>(n)), barrier_(n, timeout_s) {}
  int size() const override { return n_; }
  std::string backend() const override { return "threads"; }

  // Each collective is publish (a meeting), the work on slices, and a closing meeting; the
  // composite ones keep the published buffers for their second half instead of publishing again.
  void all_reduce_sum(int rank, at::Tensor& t) override {
    publish(rank, t);
    sum_own_slice(rank, t);
    meet();
    take_other_slices(rank, t);
    meet();
  }
  void reduce_scatter_sum(int rank, at::Tensor& t) override {
    publish(rank, t);
    sum_own_slice(rank, t);
    meet();
  }
  void all_gather(int rank, at::Tensor& t) override {
    publish(rank, t);
    take_other_slices(rank, t);
    meet();
  }
  void reduce_sum(int rank, at::Tensor& t, int root) override {
    publish(rank, t);
    sum_own_slice(rank, t);  // rank i sums slice i, as for all_reduce_sum: the same values
    meet();
    if (rank == root) take_other_slices(rank, t);
    meet();
  }
  void broadcast(int rank, at::Tensor& t, int root) override {
    publish(rank, t);
    if (rank != root) t.copy_(bufs_[root]);
    meet();
  }
  void barrier(int rank) override { meet(); }  // a thread group's work is done when its calls return
  void wait_device(int, const std::string&) override {}
  void abort(const std::string& why) override { barrier_.abort(why); }

 private:
  // Slice `rank` of t <- itself plus that slice of every other rank's buffer, in rank order.
  void sum_own_slice(int rank, at::Tensor& t) {
    const int64_t lo = Sharding::begin(t.numel(), n_, rank), hi = Sharding::begin(t.numel(), n_, rank + 1);
    if (hi <= lo) return;
    at::Tensor mine = t.slice(0, lo, hi);
    for (int r = 0; r < n_; ++r)
      if (r != rank) mine.add_(bufs_[r].slice(0, lo, hi));
  }
  // Every other slice r of t <- slice r of rank r's buffer.
  void take_other_slices(int rank, at::Tensor& t) {
    for (int r = 0; r < n_; ++r) {
      const int64_t lo = Sharding::begin(t.numel(), n_, r), hi = Sharding::begin(t.numel(), n_, r + 1);
      if (r != rank && hi > lo) t.slice(0, lo, hi).copy_(bufs_[r].slice(0, lo, hi));
    }
  }
  void publish(int rank, const at::Tensor& t) {
    SYN_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 1 && t.is_contiguous(),
              "a thread-group collective needs a contiguous 1-D float32 CPU buffer", "this is a bug");
    bufs_[rank] = t;
    meet();
    SYN_CHECK(bufs_[0].numel() == t.numel(),
              fmt::format("local rank {} passed {} elements to a collective, rank 0 passed {}", rank, t.numel(),
                          bufs_[0].numel()),
              "this is a bug: every local replica must issue the same collectives");
  }
  void meet() { barrier_.arrive_and_wait(); }

  const int n_;
  std::vector<at::Tensor> bufs_;
  AbortableBarrier barrier_;
};

}  // namespace

std::unique_ptr<LocalGroup> make_local_group(int cpu_replicas, const std::vector<int>& devices, double timeout_s) {
  if (devices.empty()) {
    SYN_CHECK(cpu_replicas >= 1, fmt::format("{} local CPU replicas requested", cpu_replicas),
              "set dist.local_replicas to 1 or more");
    return std::make_unique<ThreadGroup>(cpu_replicas, timeout_s);
  }
#ifdef SYNCOPATE_NCCL
  return make_nccl_group(devices, timeout_s);
#else
  SYN_FAIL(fmt::format("{} local GPUs need NCCL, and this build has none", devices.size()),
           "rebuild where CMake finds NCCL (the torch wheel's nvidia/nccl or the CUDA toolkit), or run one GPU per "
           "process with dist.local_replicas=1");
#endif
}

}  // namespace syncopate
