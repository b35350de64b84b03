#include "worker/sync/gradient_sync.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/comm/local_group.h"
#include "common/check.h"
#include "common/comm/host_staging.h"
#include "model/flat_parameters.h"
#include "server/ps_client.h"
#include "server/ps_keys.h"

namespace syncopate {
namespace {

// 64-bit digest of a float buffer's bytes.
uint64_t digest(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  const auto* w = reinterpret_cast<const uint32_t*>(c.data_ptr());
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int64_t i = 0; i < c.numel(); ++i) h = (h ^ w[i]) * 0x100000001b3ULL;
  return h;
}

}  // namespace

void share_ints(std::vector<int64_t>& v, bool source, const at::TensorOptions& options,
                const std::function<void(at::Tensor&)>& sum_exact) {
  constexpr int kPieces = 3;  // 66 bits: any int64 >= 0
  constexpr int kBits = 22;   // exact in float32 (below 2^24), whatever the sum order
  std::vector<float> pieces(v.size() * kPieces, 0.f);
  if (source)
    for (size_t k = 0; k < v.size(); ++k)
      for (int j = 0; j < kPieces; ++j)
        pieces[k * kPieces + j] = static_cast<float>((v[k] >> (kBits * j)) & ((int64_t{1} << kBits) - 1));
  at::Tensor t = at::from_blob(pieces.data(), {static_cast<int64_t>(pieces.size())}, at::kFloat)
                     .to(options.dtype(at::kFloat), /*non_blocking=*/false, /*copy=*/true);
  sum_exact(t);
  const at::Tensor h = t.cpu();
  for (size_t k = 0; k < v.size(); ++k) {
    v[k] = 0;
    for (int j = 0; j < kPieces; ++j) v[k] |= static_cast<int64_t>(h.data_ptr<float>()[k * kPieces + j]) << (kBits * j);
  }
}

bool elastic_agree(float flag, int device, const std::function<void(at::Tensor&)>& sum_exact,
                   const std::function<void(const std::string&)>& lost) {
  at::Tensor f = at::full({1}, flag, replica_options(device));
  try {
    sum_exact(f);
    return f.cpu().item<float>() > 0;
  } catch (const Error& e) {
    lost(e.what());
    return true;
  }
}

void elastic_check_identical(const at::Tensor& params, int64_t step, int rank, int world, int device,
                             const std::function<void(at::Tensor&)>& sum_exact,
                             const std::function<void(const std::string&)>& lost) {
  struct LinkLost {};  // (an Error from the check itself, differing weights, must reach the caller)
  try {
    check_replicas_identical(params, step, rank, world, 1, device, [&](at::Tensor& t) {
      try {
        sum_exact(t);
      } catch (const Error& e) {
        lost(e.what());
        throw LinkLost{};
      }
    });
  } catch (const LinkLost&) {
    // the owner re-forms the ring at its next boundary
  }
}

std::vector<std::pair<std::string, at::Tensor>> local_sgd_state(const at::Tensor& start, const at::Tensor& momentum) {
  return {{"outer_start", start}, {"outer_momentum", momentum}};
}

SyncSetup node_only(const SyncSetup& s) {
  SyncSetup n = s;
  n.ring = nullptr;
  n.dist.mode = "ring";
  n.dist.sync_every = 1;
  n.dist.clip_scope = "job";  // the job of the inner steps is the node
  return n;
}

int64_t pushes_per_version(PsClient& client, int nodes) {
  const auto j = nlohmann::json::parse(client.stats(0));
  const std::string c = j.value("consistency", std::string());
  if (c == "bsp") return std::max<int64_t>(1, nodes - j.value("backup_workers", int64_t{0}));
  return c == "ssp" || c == "asp" ? 1 : 0;
}

int64_t ps_job_tokens(const PsClient* client, int64_t per_version, int64_t steps_per_push, int64_t node_tokens,
                      int64_t per_step, int nodes) {
  if (!client || per_version <= 0) return node_tokens * nodes;
  const auto v = client->latest_versions();
  return v.empty() ? node_tokens * nodes : *std::min_element(v.begin(), v.end()) * per_version * steps_per_push * per_step;
}

ShippedWeights ps_final_weights(PsClient& client, HostStaging& staging, const at::Tensor& like, int64_t tokens_per_version,
                                const GradientSync::WaitProgress& while_waiting) {
  std::function<void(int64_t)> on_poll;
  if (while_waiting && tokens_per_version > 0)
    on_poll = [&](int64_t version) {
      while_waiting(version * tokens_per_version, [&] {
        at::Tensor now = staging.copy_of(like);
        client.pull(now);
        return now;
      });
    };
  const bool complete = client.wait_for_other_workers(0.05, on_poll);  // their last pushes land first
  at::Tensor host = staging.copy_of(like);
  client.pull(host);
  return {host, "servers", complete};
}

int64_t partition_elems(const DistConfig& d) {
  return d.ps_partition_mb > 0 ? std::max<int64_t>(1, static_cast<int64_t>(d.ps_partition_mb * (1 << 20) / 4)) : 0;
}

PsClientOptions ps_connection_options(const DistConfig& d, const std::string& token, const std::string& model_digest) {
  PsClientOptions o;
  o.timeout_s = d.timeout_s;
  o.curve_server_key = ps_client_server_key(token, d.ps_encrypt, d.curve_server_key);
  o.wire = parse_wire_format(d.wire);
  o.model_digest = model_digest;
  o.partition_elems = partition_elems(d);
  return o;
}

PsClientOptions ps_client_options(const SyncSetup& s) {
  PsClientOptions o = ps_connection_options(s.dist, s.token, s.model_digest);
  o.overlap = s.dist.ps_overlap;
  o.elastic = s.dist.elastic;
  o.samples_per_step = s.samples_per_step;
  return o;
}

std::unique_ptr<GradientSync> make_gradient_sync(const SyncSetup& s, FlatParameters& flat,
                                                 const std::vector<at::Tensor>& params) {
  if (s.dist.sync_every > 1 && s.dist.mode == "ring" && s.dist.elastic) return make_elastic_local_sgd_sync(s, flat, params);
  if (s.dist.sync_every > 1)
    return s.dist.mode == "ps" ? make_ps_local_sgd_sync(s, flat, params) : make_local_sgd_sync(s, flat, params);
  if (s.dist.mode == "ps") return make_ps_sync(s, flat, params);
  if (s.dist.mode == "ring" && s.dist.elastic) return make_elastic_ring_sync(s, flat, params);
  if (s.dist.mode == "ring" || s.local_size > 1) return make_ring_sync(s, flat, params);
  SYN_CHECK(s.dist.mode == "none", fmt::format("dist.mode='{}' is not a mode", s.dist.mode), "use none, ring or ps");
  return make_local_sync(s, flat);
}

// All-gathers 24-bit pieces of every replica's digest (exact in float32) with one sum over
// `world` replicas, and names the replicas whose weights differ from replica 0's.
void check_replicas_identical(const at::Tensor& params, int64_t step, int rank, int world, int local_size, int device,
                              const std::function<void(at::Tensor&)>& sum) {
  const uint64_t d = digest(params);
  at::Tensor slots = at::zeros({2 * static_cast<int64_t>(world)}, replica_options(device));
  slots[2 * rank] = static_cast<float>(d & 0xffffff);
  slots[2 * rank + 1] = static_cast<float>((d >> 24) & 0xffffff);
  sum(slots);
  at::Tensor s = slots.to(at::kCPU);
  const float* v = s.data_ptr<float>();
  std::string bad;
  for (int r = 1; r < world; ++r)
    if (v[2 * r] != v[0] || v[2 * r + 1] != v[1])
      bad += fmt::format("{}{} (node {}, local {})", bad.empty() ? "" : ", ", r, r / local_size, r % local_size);
  SYN_CHECK(bad.empty(), fmt::format("step {}: the weights of replica(s) {} differ from replica 0's", step, bad),
            "replicas diverged (non-deterministic kernels or a bug); resume every node from the same checkpoint");
}

double node_average(LocalGroup* group, int local, int local_size, int device, double x, bool* any) {
  if (!group) return x;
  at::Tensor t = at::tensor({x, any && *any ? 1.0 : 0.0}, at::kFloat).to(replica_options(device));
  group->all_reduce_sum(local, t);
  group->wait_device(local, "the loss average");  // bounded and abortable, before the host reads it
  const at::Tensor h = t.cpu();
  if (any) *any = h.data_ptr<float>()[1] > 0;
  return static_cast<double>(h.data_ptr<float>()[0]) / local_size;
}

void share_membership(LocalGroup* group, int local, int device, int64_t& joined, int64_t& grant) {
  if (!group) return;
  std::vector<int64_t> v = {joined + 1, grant + 1};  // share_ints carries integers >= 0
  share_ints(v, local == 0, replica_options(device), [&](at::Tensor& t) {
    group->all_reduce_sum(local, t);
    group->wait_device(local, "the node's data grant");  // bounded, before the host reads it
  });
  joined = v[0] - 1, grant = v[1] - 1;
}

at::TensorOptions replica_options(int device) {
  return at::TensorOptions().dtype(at::kFloat).device(device < 0 ? at::Device(at::kCPU)
                                                                 : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

std::vector<std::pair<int64_t, int64_t>> parameter_ranges(const FlatParameters& flat) {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (const auto& seg : flat.segments) r.emplace_back(seg.offset, seg.numel);
  return r;
}

void check_switched_shards(const PsClient& client, int64_t step) {
  SYN_CHECK(client.restored_epoch() == 0,
            fmt::format("this node resumes step {} in ps mode after another synchronization, but the shards restored "
                        "checkpoints of their own (an earlier ps phase of this job): they would take the job back there",
                        step),
            "remove the shards' checkpoints (their --out directories' checkpoint files) so that they start from the "
            "job's weights, then start the job again");
}

}  // namespace syncopate
