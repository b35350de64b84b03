#include "common/comm/ring_allreduce.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/check.h"
#include "common/comm/sharding.h"
#include "common/comm/wire_format.h"

namespace syncopate {
namespace {


// Streams queued segments to a connection from its own thread, so that sending overlaps the
// caller's receiving and reducing. Errors are kept and rethrown by finish().
class SegmentSender {
 public:
  explicit SegmentSender(Connection& c) : conn_(c), thread_([this] { loop(); }) {}
  ~SegmentSender() {
    stop();
    thread_.join();
  }
  void set_wire(WireFormat f) { wire_ = f; }  // between collectives only (nothing queued)
  void push(const float* p, size_t n) {
    std::lock_guard<std::mutex> l(mu_);
    q_.emplace_back(p, n);
    cv_.notify_one();
  }
  // Waits until everything queued is sent; rethrows a send error.
  void finish() {
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return (q_.empty() && !busy_) || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  // The collective failed on the receive side: drop what is queued and wait for the segment being
  // sent, so that nothing reads the caller's buffer after the call returns.
  void abandon() {
    std::unique_lock<std::mutex> l(mu_);
    q_.clear();
    done_cv_.wait(l, [&] { return !busy_ || error_; });
  }

 private:
  void stop() {  // drops what is still queued (used when the collective is abandoned)
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    q_.clear();
    cv_.notify_one();
  }
  void loop() {
    std::vector<uint16_t> wire;
    for (;;) {
      std::pair<const float*, size_t> item;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        item = q_.front();
        q_.pop_front();
        busy_ = true;
      }
      try {
        if (wire_ != WireFormat::kF32) {  // 16 bits (fp16's range was checked where the values were made)
          wire.resize(item.second);
          auto to16 = wire_ == WireFormat::kFp16 ? to_fp16 : to_bf16;
          for (size_t i = 0; i < item.second; ++i) wire[i] = to16(item.first[i]);
          conn_.send(wire.data(), item.second * 2);
        } else {
          conn_.send(item.first, item.second * sizeof(float));
        }
      } catch (...) {
        std::lock_guard<std::mutex> l(mu_);
        error_ = std::current_exception();
        q_.clear();
        busy_ = false;
        done_cv_.notify_all();
        return;
      }
      std::lock_guard<std::mutex> l(mu_);
      busy_ = false;
      if (q_.empty()) done_cv_.notify_all();
    }
  }

  Connection& conn_;
  WireFormat wire_ = WireFormat::kF32;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<const float*, size_t>> q_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace

struct RingAllreducer::Impl {
  Impl(int r, int w, Connection& n, Connection& p) : rank(r), world(w), next(n), prev(p) {
    SYN_CHECK(rank >= 0 && rank < world, fmt::format("ring rank {} outside world {}", rank, world), "this is a bug");
  }
  void sum(float* data, size_t count, const RingAllreduceOptions& opt);

  int rank, world;
  Connection &next, &prev;
  std::vector<float> staging;   // one received segment (float32 wire)
  std::vector<uint16_t> wire;   // one received segment (16-bit wire)
  std::unique_ptr<SegmentSender> sender;  // started on first use (world > 1)
  std::exception_ptr broken;    // a failed collective leaves the links in an unknown state
  std::atomic<int64_t> sent{0};   // bytes handed to `next` by every call so far
  std::atomic<int64_t> received{0};  // bytes taken from `prev` by every call so far
};

RingAllreducer::RingAllreducer(int rank, int world, Connection& next, Connection& prev)
    : impl_(std::make_unique<Impl>(rank, world, next, prev)) {}
RingAllreducer::~RingAllreducer() = default;

void RingAllreducer::sum(float* data, size_t count, const RingAllreduceOptions& opt) { impl_->sum(data, count, opt); }
int64_t RingAllreducer::bytes_sent() const { return impl_->sent.load(); }
int64_t RingAllreducer::bytes_received() const { return impl_->received.load(); }

void ring_allreduce_sum(float* data, size_t count, int rank, int world, Connection& next, Connection& prev,
                        const RingAllreduceOptions& opt) {
  if (world <= 1 || count == 0) return;
  RingAllreducer(rank, world, next, prev).sum(data, count, opt);
}

void RingAllreducer::Impl::sum(float* data, size_t count, const RingAllreduceOptions& opt) {
  if (world <= 1 || count == 0) return;
  if (broken) std::rethrow_exception(broken);
  const size_t seg = std::max<size_t>(1, opt.segment_bytes / sizeof(float));
  auto begin = [&](size_t c) {
    return static_cast<size_t>(Sharding::begin(static_cast<int64_t>(count), world, static_cast<int>(c)));
  };
  auto mod = [&](long x) { return static_cast<size_t>(((x % world) + world) % world); };
  auto for_segments = [&](size_t c, auto&& fn) {
    for (size_t o = begin(c); o < begin(c + 1); o += seg) fn(data + o, std::min(seg, begin(c + 1) - o));
  };
  if (staging.size() < seg) staging.resize(seg);
  SYN_CHECK(opt.wire != WireFormat::kInt8, "int8 is not a wire format of the ring (every hop would requantize)",
            "use --dist.wire=bf16 or fp16 on the ring, or int8 with parameter servers");
  const bool half = opt.wire != WireFormat::kF32;  // bf16 or fp16
  auto from16 = opt.wire == WireFormat::kFp16 ? from_fp16 : from_bf16;
  auto to16 = opt.wire == WireFormat::kFp16 ? to_fp16 : to_bf16;
  if (half && wire.size() < seg) wire.resize(seg);
  if (!sender) sender = std::make_unique<SegmentSender>(next);
  sender->set_wire(opt.wire);
  const int64_t wire_bytes = half ? 2 : 4;
  // fp16's range is checked once where values are made (this rank's own chunk, each partial sum),
  // on the caller's thread, so an overflow fails by name at once (in the sender thread it would
  // surface only after the peers' timeouts); all-gather forwards values that came over the wire.
  auto fits = [&](const float* p, size_t len) {
    if (opt.wire == WireFormat::kFp16) check_fp16_range(p, static_cast<int64_t>(len));
  };
  auto send = [&](const float* p, size_t len) {
    sender->push(p, len);
    sent += static_cast<int64_t>(len) * wire_bytes;
  };
  auto receive = [&](float* dst, size_t len) {  // into dst (float32) or wire (16 bits)
    if (half) prev.recv(wire.data(), len * 2);
    else prev.recv(dst, len * sizeof(float));
    received += static_cast<int64_t>(len) * wire_bytes;
  };
  try {
    for_segments(static_cast<size_t>(rank), [&](float* p, size_t len) {
      fits(p, len);
      send(p, len);
    });
    // Reduce-scatter: receive chunk (r-s-1), add it in, and forward it at once (the last one
    // received is the fully reduced chunk (r+1), which all-gather step 0 sends).
    for (int s = 0; s < world - 1; ++s) {
      const bool last = s == world - 2;
      for_segments(mod(rank - s - 1), [&](float* p, size_t len) {
        receive(staging.data(), len);
        if (half) {
          for (size_t i = 0; i < len; ++i) p[i] += from16(wire[i]);
          fits(p, len);  // before the owner's rounding could turn an overflow into inf
          // The owner rounds its reduced chunk like the wire does, so replicas stay identical.
          if (last) for (size_t i = 0; i < len; ++i) p[i] = from16(to16(p[i]));
        } else {
          for (size_t i = 0; i < len; ++i) p[i] += staging[i];
        }
        send(p, len);
      });
    }
    // All-gather: receive the reduced chunk (r-s) in place and forward it, except on the last step.
    for (int s = 0; s < world - 1; ++s) {
      for_segments(mod(rank - s), [&](float* p, size_t len) {
        receive(p, len);
        if (half)
          for (size_t i = 0; i < len; ++i) p[i] = from16(wire[i]);
        if (s < world - 2) send(p, len);
      });
    }
    sender->finish();
  } catch (...) {
    broken = std::current_exception();
    sender->abandon();
    throw;
  }
}

void naive_allreduce_sum(float* data, size_t count, int rank, int world, Connection& next, Connection& prev) {
  if (world <= 1 || count == 0) return;
  std::vector<float> passing(data, data + count), incoming(count), sum(data, data + count);
  for (int hop = 0; hop < world - 1; ++hop) {
    std::thread t([&] { next.send(passing.data(), count * sizeof(float)); });
    prev.recv(incoming.data(), count * sizeof(float));
    t.join();
    for (size_t i = 0; i < count; ++i) sum[i] += incoming[i];
    passing.swap(incoming);
  }
  std::copy(sum.begin(), sum.end(), data);
}

}  // namespace syncopate
