#include "worker/replicas.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "common/check.h"
#include "common/rendezvous.h"
#include "common/ring_allreduce.h"

namespace syncopate {
namespace {

// One replica, or one of several that never talk to each other directly (`ps` mode: they meet
// only through the parameter servers, so there is nothing to average or check here).
class IndependentReplica : public Replicas {
 public:
  IndependentReplica(int rank, int world) : rank_(rank), world_(world) {}
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
  RingReplicas(Ring ring, const DistConfig& c) : ring_(std::move(ring)) {
    opt_.bf16_wire = c.bf16_wire;
    opt_.segment_bytes = static_cast<size_t>(c.segment_kb) << 10;
  }
  int rank() const override { return ring_.rank; }
  int world() const override { return ring_.world; }
  bool synchronous() const override { return true; }

  void average_gradients(at::Tensor& grads) override {
    sum(grads, opt_);
    grads.div_(ring_.world);
  }
  double average(double x) override {
    float v = static_cast<float>(x);
    ring_allreduce_sum(&v, 1, ring_.rank, ring_.world, *ring_.next, *ring_.prev);
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
    ring_allreduce_sum(slots.data(), slots.size(), ring_.rank, ring_.world, *ring_.next, *ring_.prev);
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
      ring_allreduce_sum(t.data_ptr<float>(), static_cast<size_t>(t.numel()), ring_.rank, ring_.world, *ring_.next, *ring_.prev, o);
    } else {  // GPU tensors go through host memory between nodes
      at::Tensor host = t.to(at::kCPU);
      ring_allreduce_sum(host.data_ptr<float>(), static_cast<size_t>(host.numel()), ring_.rank, ring_.world, *ring_.next, *ring_.prev, o);
      t.copy_(host);
    }
  }
  Ring ring_;
  RingAllreduceOptions opt_;
};

}  // namespace

std::unique_ptr<Replicas> make_replicas(const DistConfig& c, const std::string& token, const std::string& fingerprint) {
  if (c.mode == "none" || c.nnodes <= 1) return std::make_unique<IndependentReplica>(0, 1);
  if (c.mode == "ps") return std::make_unique<IndependentReplica>(static_cast<int>(c.node_rank), static_cast<int>(c.nnodes));
  RendezvousOptions o;
  o.master_addr = c.master_addr;
  o.master_port = static_cast<uint16_t>(c.master_port);
  o.nnodes = static_cast<int>(c.nnodes);
  o.node_rank = static_cast<int>(c.node_rank);
  o.token = token;
  o.fingerprint = fingerprint;
  o.timeout_s = c.timeout_s;
  return std::make_unique<RingReplicas>(connect_ring(o), c);
}

}  // namespace syncopate
