// Reduces regions of the flat gradient buffer while backward still runs (what PyTorch DDP's
// reducer does): a region is handed to a communication thread the moment every gradient in it
// is final, regions strictly in one order (descending offset, the order backward produces them)
// so that every replica issues the same collectives in the same sequence. Only the step's last
// backward is reduced (arm() before it), so gradient accumulation costs no communication.
// On a GPU the hook records where the compute stream is, the region's reduction waits for that
// point on the communication stream, and finish() makes the compute stream wait for it all.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace syncopate {

class BucketReducer {
 public:
  // bounds: ascending offsets into flat_grads, bounds.front() = 0 and bounds.back() = its size;
  // region r is [bounds[r], bounds[r+1]). reduce(r, view) runs on the communication thread, one
  // region at a time. device: the replica's CUDA device, -1 on CPU. flush (optional): a
  // pipelined reduce may return before its region is reduced (NodeAllreduce::submit); flush()
  // runs on the communication thread after the step's last region and completes them all
  // (NodeAllreduce::drain) before finish() returns.
  using Reduce = std::function<void(int region, at::Tensor view)>;
  BucketReducer(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                at::Tensor flat_grads, std::vector<int64_t> bounds, int device, Reduce reduce,
                std::function<void()> flush = {});
  ~BucketReducer();
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;

  // The next backward is the step's last: reduce its regions as they become final.
  void arm();
  // After that backward: reduces the regions no hook reported (parameters without a gradient this
  // step), waits for every region, and rethrows the first failed reduction. Returns false (and
  // does nothing) when arm() was not called before the backward.
  bool finish();
  // After a failed reduction (sticky until now), once the collectives under `reduce` were replaced
  // (an elastic ring re-formed): waits until the communication thread has passed every region it
  // was given, then takes work again.
  void recover();
  int regions() const;
  // Regions launched from gradient hooks during backward, and regions reduced in all, so far.
  int64_t launched_early() const;
  int64_t reduced() const;
  // A gate the communication thread passes before reducing each region: gate(share), share being
  // the part of the flat buffer from the region's first value to the end (the share of backward
  // done when the region is final). The emulation's pacer blocks there until that modelled moment
  // (emulate.overlap). Set before the first backward; none by default.
  void set_gate(std::function<void(double)> gate);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// DDP's buckets: parameters in reverse registration order, cut once a bucket holds first_cap
// elements (the first, so that communication starts early), then cap elements; each bucket is
// one contiguous range of the flat buffer. Returns the ascending region bounds.
std::vector<int64_t> bucket_bounds(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t first_cap,
                                   int64_t cap);

}  // namespace syncopate
