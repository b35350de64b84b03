#include "worker/replicas.h"

#include <algorithm>

#include <condition_variable>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/rendezvous.h"
#include "common/ring_allreduce.h"
#include "worker/gradient_readiness.h"

namespace syncopate {
namespace {

// One replica, or one of several that never talk to each other directly (`ps` mode: they meet
// only through the parameter servers, so there is nothing to average or check here).
class IndependentReplica : public Replicas {
 public:
  IndependentReplica(int rank, int world) : rank_(rank), world_(world) {}
  void set_resume_step(int64_t s) { resume_step_ = s; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  bool synchronous() const override { return world_ == 1; }
  void average_gradients(at::Tensor&) override {}
  double average(double x) override { return x; }
  void broadcast_from_rank0(at::Tensor&) override {}
  void check_identical(const at::Tensor&, int64_t) override {}

 private:
  int rank_, world_;
};

// 64-bit digest of a float buffer's bytes.
uint64_t digest(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const auto* w = reinterpret_cast<const uint32_t*>(c.data_ptr());
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int64_t i = 0; i < c.numel(); ++i) h = (h ^ w[i]) * 0x100000001b3ULL;
  return h;
}

class RingReplicas : public Replicas {
 public:
  RingReplicas(Ring ring, const DistConfig& c)
      : ring_(std::move(ring)), cfg_(c),
        allreducer_(std::make_unique<RingAllreducer>(ring_.rank, ring_.world, *ring_.next, *ring_.prev)) {
    resume_step_ = ring_.resume_step;
    opt_.bf16_wire = c.bf16_wire;
    opt_.segment_bytes = static_cast<size_t>(c.segment_kb) << 10;
  }
  ~RingReplicas() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (comm_.joinable()) comm_.join();
    if (rounds_ > 0 && ring_.rank == 0)
      std::cout << fmt::format("[dist] {} of {} bucket reductions started during backward\n", early_,
                               rounds_ * static_cast<int64_t>(buckets_.size()));
  }

  // Buckets: parameters in reverse registration order (the order backward produces them), cut
  // at first_bucket_kb, then bucket_kb; each bucket is one contiguous range of the flat buffer.
  // GradientReadiness reports a bucket once all its parameters' gradients are final.
  void attach(const std::vector<at::Tensor>& params, const std::vector<std::pair<int64_t, int64_t>>& ranges,
              at::Tensor flat_grads) override {
    if (!cfg_.overlap || !flat_grads.is_cpu()) return;  // GPU buffers: whole-buffer reduction after backward
    grads_ = flat_grads;
    int64_t cap = cfg_.first_bucket_kb * 1024 / 4, size = 0;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      if (buckets_.empty() || size >= cap) {
        if (!buckets_.empty()) cap = cfg_.bucket_kb * 1024 / 4;
        buckets_.push_back({ranges[i].first + ranges[i].second, ranges[i].first + ranges[i].second});
        size = 0;
      }
      buckets_.back().lo = ranges[i].first;
      size += ranges[i].second;
    }
    // Regions in ascending buffer order: region r is bucket B-1-r.
    const int B = static_cast<int>(buckets_.size());
    std::vector<int64_t> bounds;
    for (int b = B - 1; b >= 0; --b) bounds.push_back(buckets_[b].lo);
    bounds.push_back(buckets_.front().hi);
    ready_ = std::make_unique<GradientReadiness>(params, ranges, bounds, [this, B](int region) {
      std::lock_guard<std::mutex> l(mu_);
      buckets_[B - 1 - region].final = true;
      const int before = next_launch_;
      launch_ready(false);
      early_ += next_launch_ - before;
    });
    comm_ = std::thread([this] { comm_loop(); });
    if (ring_.rank == 0)
      std::cout << fmt::format("[dist] {} gradient buckets, all-reduced during backward\n", buckets_.size());
  }

  void arm_overlap() override {
    if (buckets_.empty()) return;
    std::lock_guard<std::mutex> l(mu_);
    armed_ = true;
    for (auto& b : buckets_) b.final = false;
    next_launch_ = 0;
    done_ = 0;
    ready_->arm();
  }
  int rank() const override { return ring_.rank; }
  int world() const override { return ring_.world; }
  bool synchronous() const override { return true; }

  void average_gradients(at::Tensor& grads) override {
    if (armed_) {
      ready_->disarm();  // backward is over; later backwards must not launch anything
      std::unique_lock<std::mutex> l(mu_);
      ++rounds_;
      launch_ready(/*all=*/true);  // parameters without a gradient this step: reduce them now, in order
      cv_.wait(l, [&] { return done_ == static_cast<int>(buckets_.size()) || error_; });
      armed_ = false;
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    } else {
      sum(grads, opt_);
    }
    grads.div_(ring_.world);
  }
  double average(double x) override {
    float v = static_cast<float>(x);
    allreducer_->sum(&v, 1);
    return v / ring_.world;
  }
  void broadcast_from_rank0(at::Tensor& params) override {
    if (ring_.rank != 0) params.zero_();
    sum(params, RingAllreduceOptions{opt_.segment_bytes, /*bf16_wire=*/false});  // x + 0 + ... + 0 == x exactly
  }
  void check_identical(const at::Tensor& params, int64_t step) override {
    // All-gather 24-bit pieces of every rank's digest (exact in float32) with one all-reduce.
    const uint64_t d = digest(params);
    std::vector<float> slots(2 * static_cast<size_t>(ring_.world), 0.0f);
    slots[2 * ring_.rank] = static_cast<float>(d & 0xffffff);
    slots[2 * ring_.rank + 1] = static_cast<float>((d >> 24) & 0xffffff);
    allreducer_->sum(slots.data(), slots.size());
    std::string bad;
    for (int r = 1; r < ring_.world; ++r)
      if (slots[2 * r] != slots[0] || slots[2 * r + 1] != slots[1]) bad += (bad.empty() ? "" : ", ") + std::to_string(r);
    SYN_CHECK(bad.empty(), fmt::format("step {}: the weights of node(s) {} differ from node 0's", step, bad),
              "replicas diverged (non-deterministic kernels or a bug); resume every node from the same checkpoint");
  }

 private:
  void sum(at::Tensor& t, const RingAllreduceOptions& o) {
    SYN_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "ring all-reduce needs a contiguous float32 buffer",
              "this is a bug");
    if (t.is_cpu()) {
      allreducer_->sum(t.data_ptr<float>(), static_cast<size_t>(t.numel()), o);
    } else {  // GPU tensors go through host memory between nodes
      at::Tensor host = t.to(at::kCPU);
      allreducer_->sum(host.data_ptr<float>(), static_cast<size_t>(host.numel()), o);
      t.copy_(host);
    }
  }
  struct Bucket {
    int64_t lo, hi;      // [lo, hi) of the flat gradient buffer
    bool final = false;  // every gradient in it is final in this backward
  };
  // Queues buckets for the communication thread strictly in index order (the same on every rank).
  void launch_ready(bool all) {
    while (next_launch_ < static_cast<int>(buckets_.size()) && (all || buckets_[next_launch_].final))
      queue_.push_back(next_launch_++);
    cv_.notify_all();
  }
  void comm_loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const Bucket b = buckets_[queue_.front()];
      queue_.pop_front();
      l.unlock();
      std::exception_ptr err;
      try {
        allreducer_->sum(grads_.data_ptr<float>() + b.lo, static_cast<size_t>(b.hi - b.lo), opt_);
      } catch (...) {
        err = std::current_exception();
      }
      l.lock();
      if (err) error_ = err;
      ++done_;
      cv_.notify_all();
    }
  }

  Ring ring_;
  DistConfig cfg_;
  std::unique_ptr<RingAllreducer> allreducer_;  // one sender thread and buffer set for every collective
  RingAllreduceOptions opt_;
  at::Tensor grads_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<GradientReadiness> ready_;
  int64_t early_ = 0, rounds_ = 0;  // buckets launched from hooks, of rounds x buckets
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int next_launch_ = 0, done_ = 0;
  bool armed_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread comm_;  // started in attach()
};

}  // namespace

std::unique_ptr<Replicas> make_replicas(const DistConfig& c, const std::string& token, const std::string& fingerprint,
                                        const std::vector<int64_t>& checkpoints) {
  if (c.mode == "none" || c.nnodes <= 1 || c.mode == "ps") {  // no peers to agree with: the newest local one
    auto r = c.mode == "ps" ? std::make_unique<IndependentReplica>(static_cast<int>(c.node_rank), static_cast<int>(c.nnodes))
                            : std::make_unique<IndependentReplica>(0, 1);
    r->set_resume_step(checkpoints.empty() ? -1 : *std::max_element(checkpoints.begin(), checkpoints.end()));
    return r;
  }
  RendezvousOptions o = rendezvous_options(c, token, fingerprint);
  o.checkpoints = checkpoints;
  return std::make_unique<RingReplicas>(connect_ring(o), c);
}

}  // namespace syncopate
