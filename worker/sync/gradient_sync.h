// The one seam between the training loop and data parallelism: how this replica's gradient
// becomes the next parameters, given every other replica of the job. The loop calls, per step:
//
//   begin_last_backward(lr, step)  before the step's last backward (work may start during it)
//   finish_step(params, grads, lr, step) -> {staleness, grad_norm, wire_bytes}
//                                  average over replicas, clip (optim.grad_clip), update params
//   synchronize(params)            before evaluations, checkpoints and the end (an update in flight lands)
//
// Implementations (one file each; a new mode — local SGD, compressed wire formats — is one more):
//   LocalSync  (local_sync.cpp)  one replica alone: clip and AdamW, nothing else
//   RingSync   (ring_sync.cpp)   every replica takes every step together: buckets of the flat
//                                gradient summed during backward through NodeAllreduce (the
//                                node's local group and the ring of nodes), then AdamW locally
//   PsSync     (ps_sync.cpp)     the node's replicas average in the node; local replica 0 pushes
//                                shard k's range to server k and takes the servers' parameters
//                                (the servers hold the optimizer: no local AdamW state at all)
//   LocalSgdSync (local_sgd_sync.cpp)  dist.sync_every = H > 1 (local SGD / DiLoCo): each node
//                                steps on its own (a RingSync of its local replicas) and every H
//                                steps the nodes all-reduce their pseudo-gradients and apply one
//                                outer step (OuterOptimizer) from the round's start
//   ElasticRingSync, ElasticLocalSgdSync (elastic_ring_sync.cpp, elastic_local_sgd_sync.cpp)
//                                dist.elastic on the ring: the same, on a membership that changes
//                                (ElasticRing, elastic_ring.h) at step / round boundaries
//   PsLocalSgdSync (ps_local_sgd_sync.cpp)  the same with the parameter servers: every H steps
//                                replica 0 pushes Delta; the shards apply the outer step under
//                                BSP (sync DiLoCo), SSP or ASP (async local SGD)
// Each owns the one BucketReducer its mode needs and the clipping. Torch-free callers see only
// this header (ATen's Tensor type).
#pragma once
#include <cstdint>
#include <functional>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/flat_adamw.h"
#include "worker/sync/dist_config.h"

namespace syncopate {
class FlatParameters;
class LocalGroup;
class RendezvousSession;
struct Ring;

// What one step's synchronization reports to the loop (and metrics.jsonl).
struct StepSync {
  double staleness = 0;    // parameter versions applied between reading the weights and this update; 0 synchronous
  double grad_norm = 0;    // L2 norm of the averaged gradient, before clipping
  int64_t wire_bytes = 0;  // bytes this replica sent to other nodes for this step's gradient
  int64_t wire_bytes_received = 0;  // bytes it received from them for this step (ring: its share of the others'
                                    // sums; ps: the replies' parameters, float32 whatever dist.wire is)
  bool skipped = false;    // the averaged gradient was non-finite (or above SyncSetup::skip_grad_norm): no update
  int64_t round = -1;      // local SGD: outer rounds completed after this step; -1 in the per-step modes
  double outer_norm = 0;   // local SGD: norm of the outer update applied at this step (0 between synchronizations)
  bool job_done = false;   // BSP on parameter servers: the servers' rounds (the job's steps) reached SyncSetup::job_steps
                           // before this node's own count did (it was behind: with backup workers every push it
                           // still had to make would be dropped as late). The node ends its run here
  bool abandoned = false;  // elastic ring: a node was lost during this step's all-reduce; nothing was applied here,
                           // and regroup() decides where the job goes on (the step redone, or taken from a node
                           // that completed it). Elastic local SGD: the round's sum failed after this node's inner
                           // step; regroup() applies the round on the re-formed ring and returns the position past it
};

// Where a node's training stands at a step boundary: what an elastic ring's members take, with
// the weights and the optimizer state, from the member furthest along when the ring re-forms.
struct JobPosition {
  int64_t step = 0;           // optimizer steps done
  int64_t tokens = 0;         // the job's training tokens so far (the ring's count: every node's alike)
  int64_t data_position = 0;  // the next sample of the job's data order (WindowSampler)
};

// The weights a job would ship at some moment (what an evaluation scores), and what they are:
//   "replica": this replica's own (per-step synchronous modes: every replica holds the same);
//   "outer":   local SGD on the ring: the synchronized outer weights of the round, not a node's inner ones;
//   "servers": the parameter servers' values (as this node last received them, or pulled).
struct ShippedWeights {
  at::Tensor weights;
  std::string of = "replica";
  bool complete = true;  // final_weights(): false when some node's last updates may be missing (it stalled)
};

// Running totals since construction, for logs and tests.
struct SyncCounters {
  int64_t regions = 0;         // regions of the flat gradient handled during backward (buckets, shards); 0: none
  int64_t launched_early = 0;  // region reductions a gradient hook started while backward still ran
  int64_t reduced = 0;         // region reductions in all
  int64_t wire_bytes = 0;      // bytes sent to other nodes
  int64_t wire_bytes_received = 0;  // bytes received from them
};

// Everything a GradientSync is built from: the resolved [dist] and [optim] sections, where this
// replica is, and the node's communication objects (made once per node by join_job).
struct SyncSetup {
  DistConfig dist;
  AdamWConfig optim;
  int local = 0;                       // this replica's index in its node
  int local_size = 1;                  // replicas in the node
  int device = -1;                     // CUDA device, -1 on CPU
  std::shared_ptr<Ring> ring;          // ring mode with several nodes: the node's links; else null
  std::shared_ptr<LocalGroup> group;   // the node's local replicas; null with one
  std::string token;                   // the job secret (servers)
  double skip_grad_norm = 0;           // train.skip_grad_norm: a larger averaged gradient norm skips the update
  std::string model_digest;            // RunConfig::model_fingerprint(): ps workers must agree on it (INIT's layout)
  int64_t samples_per_step = 0;        // training samples one step of this node takes (dist.elastic: the servers' grants)
  int64_t job_steps = 0;               // train.steps, the job's budget in steps (BSP on parameter servers: a node whose
                                       // steps are behind the servers' rounds stops when the rounds reach it); 0 = none
  int64_t tokens_per_sample = 0;       // tokens in one training sample (model.block_size; elastic local SGD's token count)
  std::shared_ptr<RendezvousSession> session;  // elastic ring: the node's session with the rendezvous service; else null
  double ring_latency_s = 0;           // elastic ring: emulate.latency_ms as RendezvousOptions::latency_s (its links
                                       // are made per epoch)
};

// The finite-update guard every implementation applies to the averaged gradient before any
// optimizer sees it: true when the step must be skipped (a non-finite norm, or one above `bound` > 0).
inline bool skip_update(double grad_norm, double bound) {
  return !std::isfinite(grad_norm) || (bound > 0 && grad_norm > bound);
}

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // This replica in the job: rank = node x local_size + local of world = nodes x local_size.
  virtual int rank() const = 0;
  virtual int world() const = 0;
  int local_rank() const { return local_; }
  int local_size() const { return local_size_; }
  // Replicas whose batches make up one optimizer step of this replica: world when every replica
  // takes every step together, the node's replicas in ps mode (each node steps on its own), 1 alone.
  virtual int replicas_per_step() const = 0;

  // Every replica starts from the same parameters (rank 0's, or the servers' after INIT at `step`).
  virtual void start(at::Tensor& params, int64_t step) = 0;
  // After start(): the step this node starts at when the job decided it (dist.elastic: the job's
  // clock it joined at), else -1 (the step start() was given).
  virtual int64_t joined_step() const { return -1; }
  // dist.elastic: the first sample of this node's next step in the job's data order, as the servers
  // granted it (after start(), then after each finish_step()); -1: the data order is the step's.
  virtual int64_t data_grant() const { return -1; }
  // The elastic ring (dist.elastic, mode ring; elastic_ring_sync.cpp): at a step boundary, the
  // members agree (one small collective) whether the membership changes: a node waits to join, one
  // leaves, or one was lost (finish_step said `abandoned`, or this very collective failed). If so,
  // the ring re-forms through the rendezvous service and every member takes the weights, the
  // optimizer state and the position of the member furthest along; returns that position. `at`:
  // where this node stands (after a step it completed, or the step it abandoned). The first call
  // (after start()) forms the ring. Every other mode: nothing, nullopt.
  virtual std::optional<JobPosition> regroup(at::Tensor& params, const JobPosition& at) { return std::nullopt; }
  // This node stops after `step` while the job goes on (SIGTERM: a preemption notice). Parameter
  // servers: finish(). Elastic ring: the members are told at this boundary's agreement and re-form
  // without it at once; this node's ring is gone afterwards.
  virtual void leave(int64_t step) { finish(step); }
  // The next backward is the step's last: regions may be reduced (or pushed) as backward finishes them.
  virtual void begin_last_backward(double lr, int64_t step) {}
  // After the last backward: the gradient averaged over replicas, clipped, and params updated.
  virtual StepSync finish_step(at::Tensor& params, at::Tensor& grads, double lr, int64_t step) = 0;
  // Brings params fully up to date (waits for an update still in flight). Collective: every local
  // replica calls it at the same steps.
  virtual void synchronize(at::Tensor& params) {}
  // Mean of a scalar over this node's replicas (the logged loss). Collective within the node only.
  // any (optional): in, this replica's flag; out, whether any replica of the node set it (a SIGTERM
  // seen by one replica stops them all at the same step), in the same collective.
  virtual double average(double x, bool* any = nullptr) = 0;
  // The sum of a float tensor over every replica of the job, exactly (float32 on the wire), waited for
  // (the host may read it): one small collective that every replica calls at the same steps, for
  // decisions the job takes together (worker/train/readvise.h). Empty where there is none: parameter
  // servers (the nodes never meet) and the elastic ring (its membership may change under it).
  virtual std::function<void(at::Tensor&)> job_sum() { return {}; }
  // Throws syncopate::Error naming the replicas whose params differ from rank 0's. Collective.
  virtual void check_identical(const at::Tensor& params, int64_t step) = 0;
  // The optimizer state this replica holds (and checkpoints); null when the servers hold it.
  virtual FlatAdamW* optimizer() { return nullptr; }
  // A switch into this mode from one whose nodes held AdamW's state (worker/train/mode_switch.h), where
  // optimizer() is null: where the checkpoint's state is loaded (parameter servers: start() sends it to
  // the shards with INIT, and a shard it creates starts its AdamW from it). Null: nothing is carried.
  virtual FlatAdamW* carried_optimizer() { return nullptr; }
  // Further state a checkpoint must carry for an exact resume (local SGD: the round's start and
  // the outer momentum), by name; the tensors are the live ones (a load copies into them).
  virtual std::vector<std::pair<std::string, at::Tensor>> state() { return {}; }
  // A resume in another synchronization than the checkpoint's (worker/train/mode_switch.h): the
  // state() the checkpoint did not hold for this one starts afresh at the loaded weights (local
  // SGD: the round starts here, the outer momentum at zero). Called after the load, before start().
  virtual void restart_state(const at::Tensor& params) {}
    virtual SyncCounters counters() const = 0;
  // The run ended normally after `step` steps (not called on a partial run or a failure): peers are
  // told (ps: every shard gets FINISH, so that this node leaves the BSP/SSP count and shards that
  // exit with their job know when it is over).
  virtual void finish(int64_t step) {}
  // emulate.overlap: the gate every gradient region passes before it leaves this replica during
  // backward (BucketReducer::set_gate); modes that send nothing during backward ignore it.
  virtual void set_release_gate(std::function<void(double)> gate) {}
  // The job's tokens applied so far, as this replica knows them, from its node's count: the count
  // itself where every replica takes every step (the ring's tokens are the job's); the nodes' sum in
  // ring local SGD; with parameter servers, the shards' parameter version (the lowest over parts)
  // times the tokens one version stands for (a push of tokens_per_node_step under ASP/SSP, a
  // clock of every node's but the backup workers' under BSP; H steps each in local SGD). Not collective.
  virtual int64_t job_tokens(int64_t node_tokens, int64_t tokens_per_node_step) const { return node_tokens; }
  // The weights the job would ship now (after synchronize()); see ShippedWeights. Not collective.
  virtual ShippedWeights shipped(const at::Tensor& params) { return {params, "replica"}; }
  // The job's final weights, asked once by node 0's first replica after its last step and before
  // finish(): shipped() where every node ends together; with parameter servers, the shards' values
  // once every other node has finished (or died), pulled. Not collective. While it waits,
  // `while_waiting` (optional) is called at each poll with the job's tokens as the shards count
  // them (tokens_per_node_step as for job_tokens) and a function that pulls the servers' current
  // values: the evaluation points the job passes meanwhile are not lost.
  using WaitProgress = std::function<void(int64_t job_tokens, const std::function<at::Tensor()>& pull)>;
  virtual ShippedWeights final_weights(at::Tensor& params, int64_t tokens_per_node_step = 0,
                                       const WaitProgress& while_waiting = {}) {
    return shipped(params);
  }

 protected:
  GradientSync(int local, int local_size) : local_(local), local_size_(local_size) {}
  int local_, local_size_;
};

// The implementation of s.dist.mode: "none" (LocalSync; RingSync when the node has several
// replicas), "ring" (RingSync), "ps" (PsSync). flat: the model's flat buffers; params: the
// model's parameter tensors in registration order (views into flat), for gradient hooks.
std::unique_ptr<GradientSync> make_gradient_sync(const SyncSetup& s, FlatParameters& flat,
                                                 const std::vector<at::Tensor>& params);

// The implementations (see their files).
std::unique_ptr<GradientSync> make_local_sync(const SyncSetup& s, FlatParameters& flat);
std::unique_ptr<GradientSync> make_ring_sync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params);
std::unique_ptr<GradientSync> make_elastic_ring_sync(const SyncSetup& s, FlatParameters& flat,
                                                     const std::vector<at::Tensor>& params);
std::unique_ptr<GradientSync> make_elastic_local_sgd_sync(const SyncSetup& s, FlatParameters& flat,
                                                          const std::vector<at::Tensor>& params);
std::unique_ptr<GradientSync> make_ps_sync(const SyncSetup& s, FlatParameters& flat, const std::vector<at::Tensor>& params);
std::unique_ptr<GradientSync> make_local_sgd_sync(const SyncSetup& s, FlatParameters& flat,
                                                  const std::vector<at::Tensor>& params);
std::unique_ptr<GradientSync> make_ps_local_sgd_sync(const SyncSetup& s, FlatParameters& flat,
                                                     const std::vector<at::Tensor>& params);

// Shared by the implementations: names the replicas whose weights differ from replica 0's, from
// one sum over `world` replicas (`sum` adds a float tensor in place across them).
void check_replicas_identical(const at::Tensor& params, int64_t step, int rank, int world, int local_size, int device,
                              const std::function<void(at::Tensor&)>& sum);
// Every replica ends with the source replica's non-negative integers, exactly: 22-bit pieces
// (exact in float32 whatever the order of the sum) through one `sum_exact` (an exact float32 sum
// over the replicas; it must also wait, bounded, for the device before the host reads). Exactly
// one replica passes source = true, the others a vector of the same size. options: the device.
void share_ints(std::vector<int64_t>& v, bool source, const at::TensorOptions& options,
                const std::function<void(at::Tensor&)>& sum_exact);
// The elastic ring syncs' collectives on a ring that may break (one replica per node). `sum_exact`:
// an exact float32 sum over the members; a failed one calls `lost(why)` instead of throwing (the
// owner re-forms). elastic_agree: the sum of every member's flag is positive, or a sum failed.
// elastic_check_identical: check_replicas_identical, whose refusal of differing weights still throws.
bool elastic_agree(float flag, int device, const std::function<void(at::Tensor&)>& sum_exact,
                   const std::function<void(const std::string&)>& lost);
void elastic_check_identical(const at::Tensor& params, int64_t step, int rank, int world, int device,
                             const std::function<void(at::Tensor&)>& sum_exact,
                             const std::function<void(const std::string&)>& lost);
// Ring local SGD's checkpointed state (LocalSgdSync, ElasticLocalSgdSync: one set of names, so that
// a resume may toggle dist.elastic): the round's start and the outer momentum.
std::vector<std::pair<std::string, at::Tensor>> local_sgd_state(const at::Tensor& start, const at::Tensor& momentum);
// Local SGD's inner steps: the same replicas as `s` with no ring (the node alone, averaging in
// the node every step), every step synchronized, clipping the node's own mean gradient.
SyncSetup node_only(const SyncSetup& s);
// The parameter-server client's options of a setup (timeout, encryption key, wire format, layout).
struct PsClientOptions;
class PsClient;
PsClientOptions ps_client_options(const SyncSetup& s);
// The connection's part of them alone (timeout, encryption key, wire format, layout, the model digest the
// shards check): what a client that is not the job's training (syncopate-probe's round trips) shares with it,
// without the job's elastic membership, overlap or data grants.
PsClientOptions ps_connection_options(const DistConfig& d, const std::string& token, const std::string& model_digest);
// Node pushes one shard version stands for, from shard 0's STATS: its live nodes but the backup
// workers under BSP (one version per clock), 1 under SSP/ASP (one per push); 0 if STATS says neither.
int64_t pushes_per_version(PsClient& client, int nodes);
// The job's tokens as the shards count them (eval.every_tokens, `global_tokens`): the slowest
// shard's version x pushes per version x node steps per push x tokens per node step; without a
// client or a known pushes-per-version, node_tokens x nodes (every node alike).
int64_t ps_job_tokens(const PsClient* client, int64_t per_version, int64_t steps_per_push, int64_t node_tokens,
                      int64_t per_step, int nodes);
// The servers' values at the job's end: waits for the other workers' last pushes (stall-bounded;
// `complete` false when it gave up), then pulls every shard's part into `staging`'s host copy of `like`.
// tokens_per_version: the job's tokens one shard version stands for (0: unknown; while_waiting is
// then not called).
class HostStaging;
// After a switch into a ps mode (GradientSync::restart_state): the shards must have started from the
// job's weights (a worker's INIT). Shards that restored checkpoints of an earlier ps phase would
// silently take the job back there: refused, naming the fix.
void check_switched_shards(const PsClient& client, int64_t step);
ShippedWeights ps_final_weights(PsClient& client, HostStaging& staging, const at::Tensor& like, int64_t tokens_per_version,
                                const GradientSync::WaitProgress& while_waiting);
// dist.ps_partition_mb as float32 values per partition (0: none).
int64_t partition_elems(const DistConfig& d);
// float32 options on a replica's device (-1: CPU), for the small tensors of a collective.
at::TensorOptions replica_options(int device);
// GradientSync::average over a node's local group (null: one replica, x itself): one all-reduce of
// [x, flag], bounded and abortable before the host reads it.
double node_average(LocalGroup* group, int local, int local_size, int device, double x, bool* any);
// dist.elastic on parameter servers (PsSync, PsLocalSgdSync): local replica 0 (the one with a client)
// gives the node's other replicas the step the node joined at and its data grant (each >= -1). No-op
// without a group.
void share_membership(LocalGroup* group, int local, int device, int64_t& joined, int64_t& grant);
// The FlatParameters' [offset, length) of every parameter, in registration order.
std::vector<std::pair<int64_t, int64_t>> parameter_ranges(const FlatParameters& flat);

}  // namespace syncopate
