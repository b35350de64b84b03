#include "worker/sync/bucket_reducer.h"

#include <fmt/format.h>

#include "common/trace.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>

#include "common/check.h"
#include "common/comm/comm_stream.h"
#include "worker/sync/gradient_readiness.h"

namespace syncopate {

struct BucketReducer::Impl {
  struct Region {
    int64_t lo, hi;      // [lo, hi) of the flat gradient buffer
    bool final = false;  // every gradient in it is final in this backward
    std::shared_ptr<CommStream::Fence> fence;  // GPU: the compute-stream point its reduction waits for
    int64_t queued_us = 0;                     // tracing: when it was handed to the communication thread
  };
  at::Tensor grads;
  std::vector<Region> order;  // launch order: descending offsets (order[0] is the last region)
  Reduce reduce;
  std::function<void()> flush;       // after the step's last region: completes pipelined reductions
  std::function<void(double)> gate;  // emulate.overlap: waits for the region's modelled moment
  std::unique_ptr<CommStream> stream;
  std::unique_ptr<GradientReadiness> ready;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> queue;  // indices into `order`, for the communication thread
  int next_launch = 0, done = 0;
  bool armed = false, stop = false;
  bool broken = false;  // a reduction failed: sticky (finish() hands the error on, this stays)
  std::exception_ptr error;
  int64_t early = 0, reduced = 0;
  std::thread comm;

  // Queues regions strictly in launch order (the same on every replica).
  void launch_ready(bool all) {
    const int64_t now = Tracer::global().on() ? Tracer::now_us() : 0;
    while (next_launch < static_cast<int>(order.size()) && (all || order[next_launch].final)) {
      order[next_launch].queued_us = now;
      queue.push_back(next_launch++);
    }
    cv.notify_all();
  }
  void comm_loop() {
    stream->enter();
    Tracer::global().name_thread("gradient communication");
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return stop || !queue.empty(); });
      if (stop) return;
      const int i = queue.front();
      const Region r = order[i];
      queue.pop_front();
      const bool failed = broken;  // a region failed: issue nothing more (replicas would go out of step)
      l.unlock();
      std::exception_ptr err;
      const int region = static_cast<int>(order.size()) - 1 - i;
      const int64_t t0 = Tracer::global().on() ? Tracer::now_us() : 0;
      if (!failed) {
        try {
          if (gate) gate(static_cast<double>(grads.numel() - r.lo) / static_cast<double>(std::max<int64_t>(1, grads.numel())));
          if (r.fence) stream->wait(*r.fence);
          reduce(region, grads.slice(0, r.lo, r.hi));
          if (flush && i == static_cast<int>(order.size()) - 1) flush();
        } catch (...) {
          err = std::current_exception();
        }
      }
      if (t0)
        Tracer::global().complete("reduce region", "comm", t0, Tracer::now_us(), -1,
                                  fmt::format(R"("region":{},"bytes":{},"queued_us":{})", region, (r.hi - r.lo) * 4,
                                              t0 - r.queued_us));
      l.lock();
      if (err && !error) error = err;
      if (err) broken = true;
      ++done;
      ++reduced;
      cv.notify_all();
    }
  }
};

BucketReducer::BucketReducer(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                             at::Tensor flat_grads, std::vector<int64_t> bounds, int device, Reduce reduce,
                             std::function<void()> flush)
    : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  SYN_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == flat_grads.numel() &&
                std::is_sorted(bounds.begin(), bounds.end()),
            "gradient regions must cover the flat buffer in ascending order", "this is a bug");
  I.grads = flat_grads;
  I.reduce = std::move(reduce);
  I.flush = std::move(flush);
  for (size_t r = bounds.size() - 1; r-- > 0;) I.order.push_back({bounds[r], bounds[r + 1], false, nullptr});
  I.stream = make_comm_stream(device);
  const int R = static_cast<int>(I.order.size());
  I.ready = std::make_unique<GradientReadiness>(params, ranges, bounds, [&I, R](int region) {
    auto fence = I.stream->record_current();  // on the autograd thread: the region's gradient kernels are queued
    std::lock_guard<std::mutex> l(I.mu);
    I.order[R - 1 - region].final = true;
    I.order[R - 1 - region].fence = std::move(fence);
    const int before = I.next_launch;
    I.launch_ready(false);
    I.early += I.next_launch - before;
  });
  I.comm = std::thread([&I] { I.comm_loop(); });
}

BucketReducer::~BucketReducer() {
  impl_->ready->disarm();  // no hook may queue work from here on
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->comm.joinable()) impl_->comm.join();
}

void BucketReducer::set_gate(std::function<void(double)> gate) { impl_->gate = std::move(gate); }

void BucketReducer::arm() {
  auto& I = *impl_;
  std::lock_guard<std::mutex> l(I.mu);
  I.armed = true;
  for (auto& r : I.order) r.final = false;
  I.next_launch = 0;
  I.done = 0;
  I.ready->arm();
}

bool BucketReducer::finish() {
  auto& I = *impl_;
  if (!I.armed) return false;
  I.ready->disarm();  // backward is over; later backwards must not launch anything
  auto fence = I.stream->record_current();  // for regions whose hooks did not fire
  std::unique_lock<std::mutex> l(I.mu);
  for (auto& r : I.order)
    if (!r.final) r.fence = fence;
  I.launch_ready(/*all=*/true);  // parameters without a gradient this step: reduce them now, in order
  I.cv.wait(l, [&] { return I.done == static_cast<int>(I.order.size()) || I.error; });
  I.armed = false;
  if (I.error) std::rethrow_exception(std::exchange(I.error, nullptr));
  I.stream->join_into_current();  // the optimizer's kernels wait for the last reduction
  return true;
}

void BucketReducer::recover() {
  auto& I = *impl_;
  I.ready->disarm();
  std::unique_lock<std::mutex> l(I.mu);
  I.cv.wait(l, [&] { return I.queue.empty() && I.done == I.next_launch; });
  I.broken = false;
  I.error = nullptr;
  I.armed = false;
}

int BucketReducer::regions() const { return static_cast<int>(impl_->order.size()); }
int64_t BucketReducer::launched_early() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->early;
}
int64_t BucketReducer::reduced() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->reduced;
}

std::vector<int64_t> bucket_bounds(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t first_cap,
                                   int64_t cap) {
  // Walk parameters from the last registered; a bucket closes once it holds its cap.
  std::vector<int64_t> lows;  // bucket starts, descending
  int64_t end = 0, size = 0, limit = first_cap;
  for (const auto& [off, len] : ranges) end = std::max(end, off + len);
  for (size_t i = ranges.size(); i-- > 0;) {
    if (lows.empty() || size >= limit) {
      if (!lows.empty()) limit = cap;
      lows.push_back(ranges[i].first);
      size = 0;
    }
    lows.back() = ranges[i].first;
    size += ranges[i].second;
  }
  std::vector<int64_t> bounds(lows.rbegin(), lows.rend());
  if (bounds.empty() || bounds.front() != 0) bounds.insert(bounds.begin(), 0);
  bounds.push_back(end);
  return bounds;
}

}  // namespace syncopate
