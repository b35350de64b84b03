#include "server/parameter_shard.h"

#include "common/comm/wire_format.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/safetensors.h"
#include "server/consistency_rule.h"

namespace syncopate {

ParameterShard::ParameterShard(const PsConfig& cfg) : cfg_(cfg), mitigation_(cfg) { parse_consistency(cfg.consistency); }
ParameterShard::~ParameterShard() = default;

// Everything of an INIT is checked before anything of the shard changes (docs/PROTOCOL.md:
// "a rejected message changes nothing").
void ParameterShard::check_init(const MsgHeader& h, const float* values, const float* moments) const {
  SYN_CHECK(h.workers >= 1 && h.workers <= 4096, fmt::format("INIT with {} workers", h.workers), "workers must be 1..4096");
  SYN_CHECK(h.worker >= 0 && (h.worker < h.workers || (h.elastic && h.worker < kMaxWorkers)),
            fmt::format("INIT from worker {} of {}", h.worker, h.workers),
            "check NODE_RANK / NNODES of the workers (a node joining a running job needs --dist.elastic=true everywhere)");
  SYN_CHECK(h.join == 0 || h.elastic, fmt::format("INIT join={} from worker {} of a job whose membership is fixed", h.join, h.worker),
            "joining a running job needs --dist.elastic=true on every worker");
  SYN_CHECK(h.offset >= 0 && h.length >= 0 && h.length <= kMaxShardLength && h.offset <= (int64_t{1} << 50),
            fmt::format("INIT range [{}, +{}) is not a range", h.offset, h.length), "offset and length must be >= 0");
  SYN_CHECK(h.dtype == "f32", fmt::format("INIT values of dtype '{}'", h.dtype), "INIT's values are float32");
  wire_format_of_dtype(h.wire);  // a format this server knows, else an error naming it
  SYN_CHECK(h.clock >= 0 && h.param_version >= 0,
            fmt::format("INIT clock {} / parameter version {} invalid", h.clock, h.param_version), "they are >= 0");
  // The same bound as check(): an INIT refused there would already have created the shard.
  SYN_CHECK(std::isfinite(h.lr) && h.lr >= 0 && h.lr < 1e3, fmt::format("INIT learning rate {} is not sane", h.lr),
            "send a finite value in [0, 1e3) (a worker's INIT sends 0)");
  SYN_CHECK(h.length <= kMaxMessageBytes / 4,
            fmt::format("INIT of {} values: its reply ({} bytes) exceeds the message size limit of {} bytes", h.length,
                        h.length * 4, kMaxMessageBytes),
            "a message carries at most 2^32 float32 values: add servers or set dist.ps_partition_mb");
  SYN_CHECK(std::isfinite(h.beta1) && h.beta1 >= 0 && h.beta1 < 1 && std::isfinite(h.beta2) && h.beta2 >= 0 && h.beta2 < 1,
            fmt::format("INIT AdamW betas ({}, {}) outside [0, 1)", h.beta1, h.beta2), "check optim.beta1/beta2");
  SYN_CHECK(std::isfinite(h.eps) && h.eps > 0 && std::isfinite(h.weight_decay) && h.weight_decay >= 0,
            fmt::format("INIT AdamW eps {} / weight decay {} invalid", h.eps, h.weight_decay),
            "eps must be positive and finite, weight decay finite and >= 0");
  SYN_CHECK(h.update == "adamw" || h.update == "average" || h.update == "nesterov" || h.update == "delayed_nesterov",
            fmt::format("INIT update rule '{}' is not one this server knows", h.update),
            "use adamw, average, nesterov or delayed_nesterov (a worker and server of the same Syncopate build agree)");
  SYN_CHECK(h.outer_delay >= 0 && h.outer_delay <= (int64_t{1} << 20),
            fmt::format("INIT outer delay {} invalid", h.outer_delay),
            "dist.outer_delay in [1, 2^20], or 0 (an elastic job: the live members at each arrival)");
  SYN_CHECK(h.outer_delay > 0 || h.elastic || h.update != "delayed_nesterov",
            "INIT with delayed Nesterov over 0 arrivals in a job that is not elastic",
            "0 (the live members) is an elastic job's: set dist.outer_delay to the nodes, or dist.elastic=true");
  SYN_CHECK(std::isfinite(h.outer_lr) && h.outer_lr >= 0 && h.outer_lr <= 100 && std::isfinite(h.outer_momentum) &&
                h.outer_momentum >= 0 && h.outer_momentum < 1,
            fmt::format("INIT outer lr {} / momentum {} invalid", h.outer_lr, h.outer_momentum),
            "dist.outer_lr in [0, 100], dist.outer_momentum in [0, 1)");
  SYN_CHECK(h.update == "adamw" || cfg_.mitigation == "none",
            fmt::format("ps.mitigation={} with local SGD pushes (update '{}')", cfg_.mitigation, h.update),
            "staleness mitigations rescale gradients; pseudo-gradients of local SGD take none: use --ps.mitigation=none");
  SYN_CHECK(h.update != "delayed_nesterov" || parse_consistency(cfg_.consistency) == Consistency::kAsp,
            fmt::format("dist.outer=delayed_nesterov with ps.consistency={}", cfg_.consistency),
            "delayed Nesterov spreads its momentum over asynchronous arrivals; under bsp or ssp each round would count "
            "as one arrival, which is not DiLoCo's outer step: use --ps.consistency=asp, or --dist.outer=nesterov");
  SYN_CHECK(!(h.overlap && cfg_.backup_workers > 0),
            fmt::format("dist.ps_overlap=true with ps.backup_workers={}", cfg_.backup_workers),
            "backup workers drop a push computed on parameters older than the shard's, and an overlapped push always is "
            "(it was computed on the read before last): every other step would be dropped. Turn --dist.ps_overlap off, "
            "or run the servers with --ps.backup_workers=0");
  make_consistency_rule(cfg_, h.workers);  // backup workers against the worker count
  SYN_CHECK(!h.moments || (moments != nullptr || h.length == 0),
            fmt::format("INIT from worker {} says it carries AdamW moments but holds none", h.worker),
            "send the values, then the first and second moments");
  SYN_CHECK(!h.moments || h.update == "adamw",
            fmt::format("INIT from worker {} carries AdamW moments with update '{}'", h.worker, h.update),
            "moments are the shard's AdamW state: local SGD pushes (its inner AdamW is the node's) carry none");
  if (h.moments && h.length > 0) {
    const float* m = moments;
    const float* v = moments + h.length;
    int64_t bad = count_nonfinite(m, h.length) + count_nonfinite(v, h.length);
    for (int64_t i = 0; i < h.length; ++i) bad += v[i] < 0;
    SYN_CHECK(bad == 0, fmt::format("INIT from worker {} carries {} non-finite moments or negative second moments",
                                    h.worker, bad),
              "the worker's optimizer state is corrupt: restart it from a good checkpoint");
  }
  if (initialized_) {
    SYN_CHECK(h.elastic == elastic_,
              fmt::format("INIT from worker {} with dist.elastic={}, but the job's first worker sent {}", h.worker, h.elastic,
                          elastic_),
              "every worker of a job must run the same --dist.elastic");
    SYN_CHECK(h.offset == offset_ && h.length == length_ && (h.workers == workers_ || elastic_),
              fmt::format("INIT for range [{}, +{}) x {} workers, but this shard holds [{}, +{}) x {}", h.offset, h.length,
                          h.workers, offset_, length_, workers_),
              "every worker must run the same model and NNODES");
    SYN_CHECK(layout_.empty() || h.layout == layout_,
              fmt::format("INIT from worker {} with job layout '{}', but the job's first worker sent '{}'", h.worker,
                          h.layout, layout_),
              "every node must be given the same server list (SYNCOPATE_SERVERS / --dist.servers, same order) and the "
              "same model: compare the launch environment of this worker with the others'");
    SYN_CHECK(h.wire == wire_, fmt::format("INIT with wire format '{}', but this shard takes '{}'", h.wire, wire_),
              "every worker must run the same --dist.wire (mixed formats are refused)");
    // (The delay is delayed Nesterov's alone. An elastic job's workers send 0, the live members, by default;
    // a shard restored from a checkpoint of a fixed delay, or a joiner given another one, is refused.)
    SYN_CHECK(h.update == update_ && (h.update == "adamw" || h.update == "average" ||
                                      (h.outer_lr == outer_lr_ && h.outer_momentum == outer_mu_ &&
                                       (h.update != "delayed_nesterov" || h.outer_delay == outer_delay_))),
              fmt::format("INIT with update '{}' (outer lr {}, momentum {}, delay {}), but this shard applies '{}' ({}, {}, {})",
                          h.update, h.outer_lr, h.outer_momentum, h.outer_delay, update_, outer_lr_, outer_mu_, outer_delay_),
              "every worker must run the same dist.sync_every / dist.outer settings");
    return;
  }
  if (h.length > 0) {
    SYN_CHECK(values != nullptr, "INIT without values", "send the initial values");
    const int64_t bad = count_nonfinite(values, h.length);
    SYN_CHECK(bad == 0, fmt::format("INIT from worker {} carries {} non-finite initial values", h.worker, bad),
              "the worker's model is corrupt: restart it from a good checkpoint");
  }
}

int64_t ParameterShard::count_nonfinite(const float* v, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += !std::isfinite(v[i]);
  return bad;
}

void ParameterShard::check_decay(const int64_t* decay, size_t pairs) {
  constexpr int64_t kLimit = int64_t{1} << 50;  // offset + length never overflows
  for (size_t i = 0; i < pairs; ++i)
    SYN_CHECK(decay[2 * i] >= 0 && decay[2 * i] <= kLimit && decay[2 * i + 1] >= 0 && decay[2 * i + 1] <= kLimit,
              fmt::format("INIT weight-decay pair {} is [{}, +{})", i, decay[2 * i], decay[2 * i + 1]),
              "decay pairs are (offset, length) in the flat vector, each in [0, 2^50]: the worker is corrupt or not Syncopate's");
}

void ParameterShard::init(const MsgHeader& h, const float* values, const int64_t* decay, size_t pairs, double now_s,
                          const float* moments) {
  check_init(h, values, moments);  // everything, agreement with a first INIT included
  check_decay(decay, pairs);
  if (initialized_) return;  // later INITs only had to agree with it
  rule_ = make_consistency_rule(cfg_, h.workers);
  offset_ = h.offset;
  length_ = h.length;
  workers_ = h.workers;
  params_ = at::empty({length_}, at::kFloat);
  if (length_) std::memcpy(params_.data_ptr<float>(), values, static_cast<size_t>(length_) * sizeof(float));
  grad_sum_ = at::zeros({length_}, at::kFloat);
  std::vector<std::pair<int64_t, int64_t>> local;  // decay ranges intersected with this shard
  for (size_t i = 0; i < pairs; ++i) {
    const int64_t b = std::max(decay[2 * i], offset_), e = std::min(decay[2 * i] + decay[2 * i + 1], offset_ + length_);
    if (e > b) local.emplace_back(b - offset_, e - b);
  }
  cfg_beta1_ = h.beta1;
  cfg_beta2_ = h.beta2;
  cfg_eps_ = h.eps;
  cfg_wd_ = h.weight_decay;
  decay_ = local;
  AdamWConfig oc;
  oc.beta1 = h.beta1;
  oc.beta2 = h.beta2;
  oc.eps = h.eps;
  oc.weight_decay = h.weight_decay;
  opt_ = std::make_unique<FlatAdamW>(oc, length_, local, params_.options());
  if (h.moments && length_ > 0) {  // the state a switch carried over: AdamW goes on where the nodes' left it
    std::memcpy(opt_->exp_avg().data_ptr<float>(), moments, static_cast<size_t>(length_) * sizeof(float));
    std::memcpy(opt_->exp_avg_sq().data_ptr<float>(), moments + length_, static_cast<size_t>(length_) * sizeof(float));
  }
  if (h.moments) opt_->set_steps(h.adam_steps);
  update_ = h.update;
  wire_ = h.wire;
  layout_ = h.layout;
  outer_lr_ = h.outer_lr;
  outer_mu_ = h.outer_momentum;
  outer_delay_ = h.outer_delay;
  if (update_ != "adamw")
    outer_ = std::make_unique<OuterOptimizer>(parse_outer_rule(update_), outer_lr_, outer_mu_, length_, params_.options(),
                                              outer_delay_ > 0 ? outer_delay_ : std::max<int64_t>(1, workers_));
  clock_.assign(static_cast<size_t>(workers_), -1);
  last_stale_.assign(static_cast<size_t>(workers_), 0);
  backup_.assign(static_cast<size_t>(workers_), {});
  last_seen_.assign(static_cast<size_t>(workers_), now_s);
  live_.assign(static_cast<size_t>(workers_), true);
  finished_.assign(static_cast<size_t>(workers_), false);
  reading_.assign(static_cast<size_t>(workers_), false);
  grant_.assign(static_cast<size_t>(workers_), -1);
  grant_clock_.assign(static_cast<size_t>(workers_), 0);
  elastic_ = h.elastic;
  initialized_ = true;
}

void ParameterShard::grow(int workers) {
  if (workers <= workers_) return;
  const size_t n = static_cast<size_t>(workers);
  clock_.resize(n, -1);
  last_stale_.resize(n, 0);
  backup_.resize(n);
  last_seen_.resize(n, 0.0);
  live_.resize(n, false);  // a slot is not a member until its worker joins
  finished_.resize(n, false);
  reading_.resize(n, false);
  grant_.resize(n, -1);
  grant_clock_.resize(n, 0);
  workers_ = workers;
}

void ParameterShard::grant_next(int worker, int64_t samples, int64_t for_clock) {
  if (!grants_data()) return;
  SYN_CHECK(samples >= 1, fmt::format("worker {} of an elastic job sent no sample count", worker),
            "a worker of this Syncopate build sends it: run the same build everywhere");
  grant_[static_cast<size_t>(worker)] = data_cursor_;
  grant_clock_[static_cast<size_t>(worker)] = for_clock;
  data_cursor_ += samples;
  if (data_cursor_ > data_reserved_) {  // durable before acknowledged: a restore resumes past every grant made
    data_reserved_ = data_cursor_ + (outer_ ? kRoundGrantReserve : kGrantReserve) * samples;
    durable_due_ = true;
  }
}

int64_t ParameterShard::grant(int worker) const {
  if (!grants_data() || worker < 0 || worker >= workers_) return -1;
  return grant_[static_cast<size_t>(worker)];
}

int64_t ParameterShard::round() const {
  if (!initialized_ || !rule_->sums_clock()) return -1;
  // A worker not held in the round being collected: its last push was applied or dropped, so its
  // clock is closed. (A held push may be a late worker's older clock, counted in this round.)
  int64_t closed = -1, held = -1;
  for (int w = 0; w < workers_; ++w) {
    if (joining_.count(w)) continue;  // its clock is where it will count from, not a clock closed here
    int64_t& m = waiting_.count(w) ? held : closed;
    m = std::max(m, clock_[static_cast<size_t>(w)]);
  }
  return closed >= 0 || held < 0 ? closed + 1 : held;
}

bool ParameterShard::member(int worker) const {
  if (!initialized_ || worker < 0 || worker >= workers_) return false;
  const size_t w = static_cast<size_t>(worker);
  return live_[w] && !finished_[w] && !joining_.count(worker);
}

int64_t ParameterShard::bsp_round() const {
  int64_t m = -1;
  bool any = false;
  for (int w = 0; w < workers_; ++w)
    if (live_[static_cast<size_t>(w)]) m = std::max(m, clock_[static_cast<size_t>(w)]), any = true;
  if (!any)
    for (int64_t c : clock_) m = std::max(m, c);
  return m + (waiting_.empty() ? 1 : 0);
}

int64_t ParameterShard::join_clock(int worker) const {
  SYN_CHECK(initialized_, "shard not initialized yet", "a worker must send INIT first");
  const bool was = member(worker);
  // A member that asks has restarted (a running worker never asks). Under BSP, unless its push is
  // held in the round being collected, it is told the round after that one like any joiner, and
  // join() counts it out of the round: the others' round does not wait for its restart and the
  // round it was in (a local SGD round of H steps) to be done again. Only while someone waits in that
  // round: where nobody pushed it yet (the whole job restarting together, helper-28) it is told its
  // own next clock, or every restarted member would leave it and the round would be skipped. And not
  // a first worker of the job that never took part while no round was applied: the first INIT makes
  // every slot of the job's NNODES live, and round 0 waits for all of them.
  if (was) {
    const int64_t own = clock_[static_cast<size_t>(worker)] + 1;
    if (!rule_->sums_clock() || waiting_.count(worker)) return own;
    if (own == 0 ? version_ == 0 : waiting_.empty()) return own;  // (a first worker late for applied rounds joins)
  }
  if (rule_->sums_clock()) return bsp_round() + (live_workers() - (was ? 1 : 0) > 0 ? 1 : 0);
  int64_t slowest = std::numeric_limits<int64_t>::max(), newest = -1;
  for (int w = 0; w < workers_; ++w) {
    newest = std::max(newest, clock_[static_cast<size_t>(w)]);
    if (live_[static_cast<size_t>(w)] && !finished_[static_cast<size_t>(w)]) slowest = std::min(slowest, clock_[static_cast<size_t>(w)]);
  }
  // Never behind its own pushes: clocks this part applied for it would only come back as duplicates.
  const int64_t mine = worker >= 0 && worker < workers_ ? clock_[static_cast<size_t>(worker)] + 1 : 0;
  return std::max((slowest == std::numeric_limits<int64_t>::max() ? newest : slowest) + 1, mine);
}

int64_t ParameterShard::pushed_clock(int worker) const {
  return initialized_ && worker >= 0 && worker < workers_ ? clock_[static_cast<size_t>(worker)] : -1;
}

bool ParameterShard::join(int worker, int64_t clock, int64_t samples, double now_s, std::vector<int>* released,
                          int64_t pushed) {
  SYN_CHECK(initialized_ && elastic_, "a join to a shard whose job's membership is fixed",
            "joining a running job needs --dist.elastic=true on every worker");
  SYN_CHECK(worker >= 0 && worker < kMaxWorkers && clock >= 0,
            fmt::format("join of worker {} at clock {}", worker, clock), "worker ids are 0..4095, clocks >= 0");
  SYN_CHECK(!grants_data() || samples >= 1, fmt::format("worker {} of an elastic job joins without its sample count", worker),
            "a worker of this Syncopate build sends it: run the same build everywhere");
  grow(worker + 1);
  const size_t w = static_cast<size_t>(worker);
  // A returning worker keeps the grant it never used, for its next push (a stale resent join never
  // lowers its clock). Where a part received a push of the grant's clock, the worker computed on it
  // before it died (its push reached other parts, not this one): fresh samples, or those would be
  // trained on twice (helper-28's first gap; protocol 10).
  if (grant_[w] < 0 || pushed >= grant_clock_[w]) grant_next(worker, samples, clock);
  grant_clock_[w] = std::max(grant_clock_[w], clock);
  // A restarted member whose last push is held here in the round being collected, while another part
  // completed that round and the join names a later clock: the join waits for the round's release
  // (apply_rejoins), or its clock would move inside the round (helper-28's second gap; protocol 11).
  last_seen_[w] = now_s;
  if (member(worker) && waiting_.count(worker) && clock > clock_[w] + 1) {
    rejoin_[worker] = clock;
    return false;
  }
  rejoin_.erase(worker);
  return enter(worker, clock, released);
}

bool ParameterShard::enter(int worker, int64_t clock, std::vector<int>* released) {
  const size_t w = static_cast<size_t>(worker);
  // A member (restarted: see join_clock) joining past its own next clock, its push not held here: it
  // leaves the round being collected first (as FINISH would), which may complete that round. Also
  // where this part still counted a worker that another part had already expired.
  if (member(worker) && !waiting_.count(worker) && clock > clock_[w] + 1) {
    live_[w] = false;
    ++membership_epoch_;
    std::vector<int> ready = rule_->sums_clock() ? release_bsp() : release_held();
    for (int j : admit_joiners()) ready.push_back(j);  // nobody left to wait for: held joiners count at once
    if (released) released->insert(released->end(), ready.begin(), ready.end());
  }
  int64_t& c = clock_[w];
  c = std::max(c, clock - 1);  // its next push is `clock`; a clock this part applied for it never goes back
  finished_[w] = false;
  reading_[w] = false;
  if (member(worker)) return !waiting_.count(worker);  // a member held in the round gets its reply with the round
  if (rule_->sums_clock() && live_workers() > 0) {
    const int64_t round = bsp_round();
    if (clock > round) {
      joining_[worker] = clock;  // counted from its round on; its reply then
      return false;
    }
    // This part's rounds passed `clock` while the worker asked the others (they counted it from
    // `clock` on): it counts here from the round being collected, and its pushes of the clocks in
    // between are answered at once as duplicates (as a late push is dropped on one shard and
    // applied on another with backup workers). Never refused: a refusal after other parts admitted
    // it would leave their rounds waiting for it while it asked again.
    c = std::max(c, round - 1);
  }
  joining_.erase(worker);
  live_[w] = true;
  ++membership_epoch_;
  return true;
}

// Workers whose held push was just released and whose join waited for it (join()): the join takes
// effect now. One counted at once stays in `released` (its reply answers the join); one held as a
// joiner of a later round leaves it (its reply comes with that round). Others it releases are added.
void ParameterShard::apply_rejoins(std::vector<int>& released) {
  if (rejoin_.empty()) return;
  std::vector<int> out, more;
  for (int w : released) {
    auto it = rejoin_.find(w);
    if (it == rejoin_.end() || waiting_.count(w)) {
      out.push_back(w);
      continue;
    }
    const int64_t clock = it->second;
    rejoin_.erase(it);
    if (enter(w, clock, &more)) out.push_back(w);
  }
  for (int w : more)
    if (std::find(out.begin(), out.end(), w) == out.end()) out.push_back(w);
  released = std::move(out);
}

std::vector<int> ParameterShard::admit_joiners() {
  std::vector<int> ready;
  if (joining_.empty()) return ready;
  const bool nobody = live_workers() == 0;
  const int64_t round = bsp_round();
  for (auto it = joining_.begin(); it != joining_.end();) {
    if (nobody || it->second <= round) {
      const size_t w = static_cast<size_t>(it->first);
      clock_[w] = std::max(clock_[w], round - 1);  // counted from this round on
      live_[w] = true;
      ++membership_epoch_;
      ready.push_back(it->first);
      it = joining_.erase(it);
    } else {
      ++it;
    }
  }
  return ready;
}

void ParameterShard::check(const MsgHeader& h) const {
  SYN_CHECK(initialized_, "shard not initialized yet", "a worker must send INIT first");
  SYN_CHECK(h.worker >= 0 && h.worker < workers_, fmt::format("worker id {} outside 0..{}", h.worker, workers_ - 1),
            "check NODE_RANK / NNODES of the workers");
  SYN_CHECK(h.offset == offset_ && h.length == length_,
            fmt::format("range [{}, +{}) does not match this shard's [{}, +{})", h.offset, h.length, offset_, length_),
            "workers and servers disagree on the sharding: same model and server list everywhere");
  SYN_CHECK(h.type != static_cast<int>(MsgType::kPushPull) || h.dtype == wire_, fmt::format("a push of dtype '{}' to a shard whose workers agreed on '{}'", h.dtype, wire_),
            "every worker must run the same --dist.wire (mixed formats are refused)");
  SYN_CHECK(std::isfinite(h.lr) && h.lr >= 0 && h.lr < 1e3, fmt::format("learning rate {} is not sane", h.lr), "check the schedule");
  SYN_CHECK(h.type != static_cast<int>(MsgType::kPushPull) || !grants_data() || h.samples >= 1,
            fmt::format("a push of worker {} to an elastic job without its sample count", h.worker),
            "a worker of this Syncopate build sends it: run the same build everywhere");
  // A parameter version above ours is legal: this shard restarted from a checkpoint older than
  // what the worker last read. Its staleness then counts as 0.
  SYN_CHECK(h.clock >= 0 && h.param_version >= 0,
            fmt::format("clock {} / parameter version {} invalid", h.clock, h.param_version),
            "the worker's state is corrupt; restart it");
}

void ParameterShard::apply(const at::Tensor& grad, double lr) {
  // Replies send params_ without copying: ZeroMQ holds a reference until the bytes are on the
  // wire. An update while such a reply is in flight writes into a fresh copy instead.
  if (params_.use_count() > 1) params_ = params_.clone();
  if (outer_ && outer_delay_ == 0)  // delayed Nesterov over the members present (an elastic job's joins and leaves)
    outer_->set_delay(std::max(1, live_workers()));
  if (outer_) outer_->step(params_, grad, params_);  // local SGD: the pseudo-gradient, from the current weights
  else opt_->step(params_, grad, lr);
  ++version_;
  ++updates_;
}

// Versions applied since the read a push names: of this epoch exactly; of an earlier one (read
// before this shard was restored) counted from the number, the best estimate there is (the values
// it names may have been lost with the crash). A number above ours counts 0.
int64_t ParameterShard::staleness_of(int64_t param_version) const {
  const int64_t read = updates_of(param_version);
  return std::max<int64_t>(0, version_ - read);
}

void ParameterShard::pulled(int worker) {
  if (!mitigation_.keeps_backups()) return;
  std::vector<Backup>& kept = backup_[static_cast<size_t>(worker)];
  if (!kept.empty() && kept.back().version == wire_version()) return;  // the same values again (a resent reply)
  Backup b;
  if (kept.size() >= kBackupsPerWorker) {  // reuse the oldest buffer: no fresh pages per pull
    b = std::move(kept.front());
    kept.erase(kept.begin());
  }
  b.version = wire_version();
  if (b.values.defined() && b.values.numel() == params_.numel()) b.values.copy_(params_);
  else b.values = params_.clone();
  kept.push_back(std::move(b));
}

const ParameterShard::Backup* ParameterShard::backup_of(int worker, int64_t version) const {
  for (const Backup& b : backup_[static_cast<size_t>(worker)])
    if (b.version == version) return &b;
  return nullptr;
}

// DC-ASGD's compensated gradient g + lambda * g * g * (w_now - w_backup), in one pass.
const at::Tensor& ParameterShard::delay_compensated(const float* g, const at::Tensor& backup) {
  if (!dc_buf_.defined() || dc_buf_.numel() != length_) dc_buf_ = at::empty({length_}, at::kFloat);
  const float lam = static_cast<float>(mitigation_.dc_lambda());
  const float* w = params_.data_ptr<float>();
  const float* b = backup.data_ptr<float>();
  float* out = dc_buf_.data_ptr<float>();
  at::parallel_for(0, length_, int64_t{1} << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) out[i] = g[i] + lam * g[i] * g[i] * (w[i] - b[i]);
  });
  return dc_buf_;
}

std::vector<int> ParameterShard::push(const MsgHeader& h, const float* data, double now_s) {
  check(h);
  const size_t w = static_cast<size_t>(h.worker);
  at::Tensor g = length_ ? at::from_blob(const_cast<float*>(data), {length_}, at::kFloat) : at::empty({0}, at::kFloat);
  // A non-finite or (ps.max_grad_norm) oversized gradient never reaches the optimizer; nothing but
  // the count changes, and the worker gets an ERROR naming the reason. One vectorized pass per
  // push: a NaN or Inf makes the norm non-finite, and only then are the values counted.
  const double norm = length_ ? g.norm().item<double>() : 0.0;
  if (!std::isfinite(norm)) {
    if (const int64_t bad = count_nonfinite(data, length_); bad > 0) {
      ++rejected_;
      SYN_FAIL(fmt::format("worker {} pushed a gradient with {} non-finite values at clock {}; refused", h.worker, bad, h.clock),
               "the worker diverged or is faulty: it should skip such a step (the trainer does)");
    }
  }
  if (cfg_.max_grad_norm > 0 && norm > cfg_.max_grad_norm) {
    ++rejected_;
    SYN_FAIL(fmt::format("worker {} pushed a gradient of norm {:.4g} on this shard at clock {}, above ps.max_grad_norm={}",
                         h.worker, norm, h.clock, cfg_.max_grad_norm),
             "raise --ps.max_grad_norm, or find why the worker's gradient exploded");
  }
  if (now_s >= 0) revive(h.worker, now_s);  // alive (and back in the BSP/SSP count if it had expired)
  if (h.clock <= clock_[w]) {  // a resent push (the worker timed out waiting): never apply twice
    ++duplicates_;
    // A copy of the push that is held waits with it; a duplicate of an older clock (a worker
    // resumed from an older checkpoint, replaying) is answered at once, also while a newer push of
    // that worker is held: it must not stall the replay.
    const bool held_copy = h.clock == clock_[w] && waiting_.count(h.worker);
    // A new grant where its grant was lost with a restore, or where the worker took its grant for this
    // clock (a joiner counted here from a later round: its pushes of the clocks in between are
    // duplicates, each computed on fresh samples); a resend of a push received keeps the one it got.
    if (grants_data() && (grant_[w] < 0 || h.clock >= grant_clock_[w])) grant_next(h.worker, h.samples, h.clock + 1);
    return held_copy ? std::vector<int>{} : std::vector<int>{h.worker};
  }
  // (A resend of its last push, above, is still answered.)
  SYN_CHECK(!reading_[w], fmt::format("worker {} pushed clock {} after it left the rounds (FINISH still reading)", h.worker, h.clock),
            "a worker leaves the rounds only once it pushes no more: a worker of this Syncopate build does; "
            "restart it (its INIT takes it back into the job)");
  SYN_CHECK(!joining_.count(h.worker),
            fmt::format("worker {} pushed clock {} before its join at clock {} took effect", h.worker, h.clock,
                        joining_.at(h.worker)),
            "a joiner waits for the reply to its join: a worker of this Syncopate build does");
  const int64_t stale = staleness_of(h.param_version);
  last_stale_[w] = stale;
  clock_[w] = h.clock;
  grant_next(h.worker, h.samples, h.clock + 1);  // the data of its next step (a resent push above keeps the one it got)
  if (rule_->drops(stale)) {  // late: its clock was applied without it
    ++dropped_;
    return {h.worker};  // the new parameters at once: the worker goes on from them
  }
  ++staleness_hist_[stale];  // updates only: a dropped gradient is counted in dropped_, not here

  if (rule_->sums_clock()) {  // BSP
    grad_sum_.add_(g);
    waiting_.insert(h.worker);
    bsp_lr_ = h.lr;
    return release_bsp();
  }
  // ASP and SSP apply every gradient on arrival, with the optional staleness mitigation.
  const double lr = mitigation_.lr(h.lr, stale);
  at::Tensor gg = g;
  // DC-ASGD compensates against the parameters the gradient was computed on: the read whose version
  // the push names. One no longer kept (a server restarted from a checkpoint) goes uncompensated.
  if (mitigation_.keeps_backups()) {
    if (const Backup* b = backup_of(h.worker, h.param_version)) gg = delay_compensated(data, b->values);
    else ++dc_uncompensated_;
  }
  apply(gg, lr);
  if (!rule_->holds_replies()) return {h.worker};
  waiting_.insert(h.worker);
  return release_held();
}

// BSP: once every live worker (all but backup_workers of them) has pushed this clock, apply the
// mean of the gradients received.
std::vector<int> ParameterShard::release_bsp() {
  if (!rule_->clock_complete(static_cast<int>(waiting_.size()), clocks())) return {};
  grad_sum_.div_(static_cast<double>(waiting_.size()));
  apply(grad_sum_, bsp_lr_);
  grad_sum_.zero_();
  std::vector<int> ready(waiting_.begin(), waiting_.end());
  waiting_.clear();
  leave_if_reading(ready);
  apply_rejoins(ready);  // a restarted member's join that waited for this round
  for (int w : admit_joiners()) ready.push_back(w);  // the next round counts them
  return ready;
}

// A worker that asked to leave the rounds still reading while its push was held leaves once that
// push is released (finish() could not take it out of a round it was part of).
void ParameterShard::leave_if_reading(const std::vector<int>& released) {
  for (int w : released)
    if (reading_[static_cast<size_t>(w)] && live_[static_cast<size_t>(w)]) live_[static_cast<size_t>(w)] = false, ++membership_epoch_;
}

void ParameterShard::registered(int worker, int64_t clock) {
  if (!initialized_ || worker < 0 || worker >= workers_ || clock < 0) return;
  // Exactly once: a worker that resumes from a checkpoint older than what this shard applied for
  // it recomputes those clocks, and their pushes are answered as duplicates, not applied again.
  // Its clock never goes back; one ahead (this shard restarted from an older checkpoint) is taken.
  int64_t& c = clock_[static_cast<size_t>(worker)];
  c = std::max(c, clock - 1);
  finished_[static_cast<size_t>(worker)] = false;  // a finished worker that starts again takes part again
  reading_[static_cast<size_t>(worker)] = false;
}

void ParameterShard::skip_grant(int worker, int64_t samples) {
  if (grants_data() && worker >= 0 && worker < workers_ && samples >= 1)
    grant_next(worker, samples, grant_clock_[static_cast<size_t>(worker)] + 1);
}

void ParameterShard::register_samples(int worker, int64_t samples) {
  if (grants_data() && worker >= 0 && worker < workers_ && grant_[static_cast<size_t>(worker)] < 0)
    grant_next(worker, samples, clock_[static_cast<size_t>(worker)] + 1);
}

int ParameterShard::live_workers() const { return static_cast<int>(std::count(live_.begin(), live_.end(), true)); }

void ParameterShard::seen(int worker, double now) {
  if (!initialized_ || worker < 0 || worker >= workers_ || finished_[static_cast<size_t>(worker)]) return;
  last_seen_[static_cast<size_t>(worker)] = now;
  if (reading_[static_cast<size_t>(worker)]) return;  // alive, reading, out of the count for good
  // In an elastic job only a join (or a push) makes a worker a member again: a heartbeat of a node
  // that restarts would otherwise bring it back at its old clock before it asks where the job is.
  if (elastic_ && !live_[static_cast<size_t>(worker)]) return;
  revive(worker, now);  // (a joiner counts from its round on, not from its first heartbeat)
}

void ParameterShard::seen_reading(int worker, double now) {
  if (initialized_ && worker >= 0 && worker < workers_ && reading_[static_cast<size_t>(worker)])
    last_seen_[static_cast<size_t>(worker)] = now;
}

void ParameterShard::revive(int worker, double now) {
  if (!initialized_ || worker < 0 || worker >= workers_ || finished_[static_cast<size_t>(worker)] || joining_.count(worker) ||
      reading_[static_cast<size_t>(worker)])
    return;
  if (!live_[static_cast<size_t>(worker)]) ++membership_epoch_;
  live_[static_cast<size_t>(worker)] = true;
  last_seen_[static_cast<size_t>(worker)] = now;
}

std::vector<int> ParameterShard::expire(double now) {
  if (!initialized_) return {};
  bool changed = false;
  for (int w = 0; w < workers_; ++w) {
    if (live_[w] && !waiting_.count(w) && now - last_seen_[w] > cfg_.worker_timeout_s) {
      live_[w] = false;
      backup_[static_cast<size_t>(w)].clear();  // DC-ASGD: a dead worker's reads are freed (it rejoins uncompensated)
      ++dead_events_;
      ++membership_epoch_;
      changed = true;
    }
  }
  for (int w = 0; w < workers_; ++w)  // one that still read went silent: it died scoring, the job is over without it
    if (reading_[static_cast<size_t>(w)] && now - last_seen_[static_cast<size_t>(w)] > cfg_.worker_timeout_s)
      reading_[static_cast<size_t>(w)] = false;
  for (auto it = joining_.begin(); it != joining_.end();)  // a joiner that went silent before its round came
    if (now - last_seen_[static_cast<size_t>(it->first)] > cfg_.worker_timeout_s) it = joining_.erase(it), changed = true;
    else ++it;
  if (!changed) return {};
  std::vector<int> ready = rule_->sums_clock() ? release_bsp() : release_held();
  for (int w : admit_joiners()) ready.push_back(w);  // nobody left to wait for: they count at once
  return ready;
}

std::vector<int> ParameterShard::finish(int worker, bool still_reading) {
  if (!initialized_ || worker < 0 || worker >= workers_) return {};
  reading_[static_cast<size_t>(worker)] = still_reading;
  if (!still_reading) finished_[static_cast<size_t>(worker)] = true;
  joining_.erase(worker);
  rejoin_.erase(worker);
  backup_[static_cast<size_t>(worker)].clear();  // DC-ASGD: memory bounded by the workers still training
  if (!live_[static_cast<size_t>(worker)] || waiting_.count(worker)) return {};
  live_[static_cast<size_t>(worker)] = false;
  ++membership_epoch_;
  std::vector<int> ready = rule_->sums_clock() ? release_bsp() : release_held();
  for (int w : admit_joiners()) ready.push_back(w);
  return ready;
}

bool ParameterShard::job_done() const {
  if (!initialized_) return false;
  bool any = false;
  for (int w = 0; w < workers_; ++w) {
    if (reading_[static_cast<size_t>(w)]) return false;
    if (!finished_[static_cast<size_t>(w)] && live_[static_cast<size_t>(w)]) return false;
    any = any || finished_[static_cast<size_t>(w)];
  }
  return any;
}

// SSP: the held workers no longer too far ahead of the slowest live one (the rule decides).
std::vector<int> ParameterShard::release_held() {
  std::vector<int> ready = rule_->releasable(waiting_, clocks());
  for (int w : ready) waiting_.erase(w);
  leave_if_reading(ready);
  apply_rejoins(ready);
  return ready;
}

ParameterShard::Image ParameterShard::image(bool copy) const {
  nlohmann::json meta = {{"offset", offset_}, {"length", length_}, {"workers", workers_}, {"version", version_},
                         {"updates", updates_}, {"opt_steps", opt_->steps()}, {"clocks", clock_},
                         {"beta1", cfg_beta1_}, {"beta2", cfg_beta2_}, {"eps", cfg_eps_}, {"weight_decay", cfg_wd_},
                         {"decay", decay_}, {"update", update_}, {"wire", wire_}, {"layout", layout_}, {"outer_lr", outer_lr_}, {"outer_momentum", outer_mu_},
                         {"outer_delay", outer_delay_}, {"outer_pending", outer_ ? outer_->pending() : 0},
                         {"waiting", std::vector<int>(waiting_.begin(), waiting_.end())}, {"bsp_lr", bsp_lr_},
                         {"finished", std::vector<bool>(finished_)}, {"epoch", epoch_}, {"elastic", elastic_},
                         {"membership_epoch", membership_epoch_}, {"data_cursor", data_reserved_},
                         {"joining", joining_}, {"rejoining", rejoin_}, {"live", std::vector<bool>(live_)},
                         {"reading", std::vector<bool>(reading_)}};
  std::vector<std::pair<std::string, at::Tensor>> t = {{"params", params_}, {"exp_avg", opt_->exp_avg()}, {"exp_avg_sq", opt_->exp_avg_sq()}};
  if (outer_) t.emplace_back("outer_momentum", outer_->momentum());
  if (outer_ && outer_->accumulated().defined()) t.emplace_back("outer_accumulated", outer_->accumulated());
  // BSP: a clock partly collected (its held workers' gradients summed, waiting for the others) is
  // saved with them, so a restored shard still holds those workers and their gradients.
  if (rule_->sums_clock() && !waiting_.empty()) t.emplace_back("bsp_pending_sum", grad_sum_);
  if (copy)
    for (auto& [name, v] : t) v = v.detach().clone();
  return {std::move(t), {{"shard", meta.dump()}}};
}

void ParameterShard::save(const std::string& path, const std::function<void()>& before_commit) const {
  const Image im = image(false);
  save_safetensors(path, im.tensors, im.metadata, before_commit);
}

void ParameterShard::resume_cursor_at(int64_t reserved) {
  SYN_CHECK(reserved >= 0, fmt::format("a reserved data cursor of {}", reserved), "the reserve record is corrupt: delete it");
  data_cursor_ = data_reserved_ = std::max(data_cursor_, reserved);
}



bool ParameterShard::load(const std::string& path, double now_s, std::map<std::string, std::string>* metadata) {
  if (!std::filesystem::exists(path)) return false;
  Safetensors st = load_safetensors(path);
  if (metadata) *metadata = st.metadata;
  SYN_CHECK(st.metadata.count("shard") && st.tensors.count("params") && st.tensors.count("exp_avg") &&
                st.tensors.count("exp_avg_sq"),
            fmt::format("'{}' is not a shard checkpoint", path), "delete it to start the shard from the workers' INIT");
  nlohmann::json m = nlohmann::json::parse(st.metadata["shard"]);
  MsgHeader h;
  h.worker = 0;  // the checkpoint speaks for the workers that initialized the shard
  h.offset = m.at("offset");
  h.length = m.at("length");
  h.workers = m.at("workers");
  h.beta1 = m.at("beta1");
  h.beta2 = m.at("beta2");
  h.eps = m.at("eps");
  h.weight_decay = m.at("weight_decay");
  h.update = m.value("update", std::string("adamw"));
  h.wire = m.value("wire", std::string("f32"));
  h.layout = m.value("layout", std::string());
  h.outer_lr = m.value("outer_lr", 0.7);
  h.outer_momentum = m.value("outer_momentum", 0.9);
  h.outer_delay = m.value("outer_delay", int64_t{1});
  h.elastic = m.value("elastic", false);
  SYN_CHECK(h.update != "delayed_nesterov" ||
                (st.tensors.count("outer_accumulated") && st.tensors["outer_accumulated"].numel() == h.length),
            fmt::format("'{}' is a delayed-Nesterov shard without its accumulated pseudo-gradients", path),
            "the checkpoint is corrupt: delete it or restore a good copy");
  SYN_CHECK(h.update == "adamw" || (st.tensors.count("outer_momentum") && st.tensors["outer_momentum"].numel() == h.length),
            fmt::format("'{}' is a local SGD shard without its outer momentum", path),
            "the checkpoint is corrupt: delete it or restore a good copy");
  SYN_CHECK(st.tensors["params"].numel() == h.length && st.tensors["exp_avg"].numel() == h.length,
            fmt::format("'{}' is inconsistent (length {} vs {} values)", path, h.length, st.tensors["params"].numel()),
            "the checkpoint is corrupt: delete it or restore a good copy");
  std::vector<int64_t> pairs;
  for (auto& p : m.at("decay")) pairs.insert(pairs.end(), {p[0].get<int64_t>() + h.offset, p[1].get<int64_t>()});
  init(h, st.tensors["params"].data_ptr<float>(), pairs.data(), pairs.size() / 2, now_s);
  opt_->exp_avg().copy_(st.tensors["exp_avg"]);
  opt_->exp_avg_sq().copy_(st.tensors["exp_avg_sq"]);
  opt_->set_steps(m.at("opt_steps"));
  if (outer_) outer_->momentum().copy_(st.tensors["outer_momentum"]);
  if (outer_ && outer_->accumulated().defined()) {
    outer_->accumulated().copy_(st.tensors["outer_accumulated"]);
    outer_->set_pending(m.value("outer_pending", int64_t{0}));
  }
  version_ = m.at("version");
  epoch_ = m.value("epoch", int64_t{0}) + 1;  // a restore begins an epoch: versions never repeat on the wire
  SYN_CHECK(version_ >= 0 && version_ < (int64_t{1} << kVersionEpochShift) && epoch_ < (int64_t{1} << 22),
            fmt::format("'{}' holds version {} of epoch {}", path, version_, epoch_ - 1),
            "the checkpoint is corrupt: delete it or restore a good copy");
  updates_ = m.at("updates");
  clock_ = m.at("clocks").get<std::vector<int64_t>>();
  SYN_CHECK(clock_.size() == static_cast<size_t>(workers_), fmt::format("'{}' holds {} clocks for {} workers", path, clock_.size(), workers_),
            "the checkpoint is corrupt: delete it or restore a good copy");
  for (int w : m.value("waiting", std::vector<int>{}))
    SYN_CHECK(w >= 0 && w < workers_, fmt::format("'{}' holds worker {} as waiting, of {}", path, w, workers_),
              "the checkpoint is corrupt: delete it or restore a good copy");
  const std::vector<int> waiting = m.value("waiting", std::vector<int>{});
  if (rule_->sums_clock() && !waiting.empty()) {
    SYN_CHECK(st.tensors.count("bsp_pending_sum") && st.tensors["bsp_pending_sum"].numel() == length_,
              fmt::format("'{}' holds {} waiting workers but not their gradients' sum", path, waiting.size()),
              "the checkpoint is corrupt: delete it or restore a good copy");
    grad_sum_.copy_(st.tensors["bsp_pending_sum"]);
  }
  waiting_ = std::set<int>(waiting.begin(), waiting.end());
  bsp_lr_ = m.value("bsp_lr", 0.0);
  const std::vector<bool> finished = m.value("finished", std::vector<bool>(static_cast<size_t>(workers_), false));
  SYN_CHECK(finished.size() == static_cast<size_t>(workers_), fmt::format("'{}' holds {} finished flags for {} workers", path, finished.size(), workers_),
            "the checkpoint is corrupt: delete it or restore a good copy");
  for (int w = 0; w < workers_; ++w)
    if (finished[static_cast<size_t>(w)]) finished_[static_cast<size_t>(w)] = true, live_[static_cast<size_t>(w)] = false;
  membership_epoch_ = m.value("membership_epoch", int64_t{0});
  data_cursor_ = m.value("data_cursor", int64_t{0});
  SYN_CHECK(data_cursor_ >= 0, fmt::format("'{}' holds the data cursor {}", path, data_cursor_),
            "the checkpoint is corrupt: delete it or restore a good copy");
  // The cursor resumes past every grant made before the crash (the reserved mark); grants handed
  // out then are not known: each worker gets a fresh one at its next push, join or duplicate.
  data_reserved_ = data_cursor_;
  std::fill(grant_.begin(), grant_.end(), -1);
  std::fill(grant_clock_.begin(), grant_clock_.end(), 0);
  if (elastic_) {  // an elastic job's slots are members only once they joined: the live set at the save
    const std::vector<bool> live = m.value("live", std::vector<bool>(static_cast<size_t>(workers_), true));
    SYN_CHECK(live.size() == static_cast<size_t>(workers_),
              fmt::format("'{}' holds {} liveness flags for {} workers", path, live.size(), workers_),
              "the checkpoint is corrupt: delete it or restore a good copy");
    for (int w = 0; w < workers_; ++w) live_[static_cast<size_t>(w)] = live[static_cast<size_t>(w)] && !finished_[static_cast<size_t>(w)];
  }
  // A worker that left the rounds still reading stays out of them, and alive for worker_timeout_s
  // from now (its heartbeats go on): the shard must not take it back into a round, nor end the job
  // before its last read.
  const std::vector<bool> reading = m.value("reading", std::vector<bool>(static_cast<size_t>(workers_), false));
  SYN_CHECK(reading.size() == static_cast<size_t>(workers_),
            fmt::format("'{}' holds {} reading flags for {} workers", path, reading.size(), workers_),
            "the checkpoint is corrupt: delete it or restore a good copy");
  for (int w = 0; w < workers_; ++w)
    if (reading[static_cast<size_t>(w)] && !finished_[static_cast<size_t>(w)])
      reading_[static_cast<size_t>(w)] = true, live_[static_cast<size_t>(w)] = false, last_seen_[static_cast<size_t>(w)] = now_s;
  for (auto& [w, c] : m.value("joining", std::map<int, int64_t>{})) {
    SYN_CHECK(w >= 0 && w < workers_ && c >= 0, fmt::format("'{}' holds worker {} joining at clock {}", path, w, c),
              "the checkpoint is corrupt: delete it or restore a good copy");
    joining_[w] = c, live_[static_cast<size_t>(w)] = false;
  }
  for (auto& [w, c] : m.value("rejoining", std::map<int, int64_t>{})) {  // (a join waiting for its held push)
    SYN_CHECK(w >= 0 && w < workers_ && c >= 0 && waiting_.count(w),
              fmt::format("'{}' holds worker {} rejoining at clock {} without a held push", path, w, c),
              "the checkpoint is corrupt: delete it or restore a good copy");
    rejoin_[w] = c;
  }
  return true;
}

int64_t ParameterShard::dc_backup_values() const {
  int64_t n = 0;
  for (const auto& kept : backup_)
    for (const Backup& b : kept) n += b.values.defined() ? b.values.numel() : 0;
  return n;
}

int64_t ParameterShard::last_staleness(int worker) const { return last_stale_[static_cast<size_t>(worker)]; }

std::string ParameterShard::stats_json(int64_t errors, double now_s, int64_t unix_us) const {
  nlohmann::json hist = nlohmann::json::object();
  for (auto& [s, n] : staleness_hist_) hist[std::to_string(s)] = n;
  nlohmann::json live = nlohmann::json::array();
  for (bool l : live_) live.push_back(l);
  nlohmann::json j{{"version", version_}, {"updates", updates_}, {"offset", offset_}, {"length", length_},
                        {"workers", workers_}, {"clocks", clock_}, {"live_workers", live_workers()}, {"dead_events", dead_events_},
                        {"dropped", dropped_}, {"rejected", rejected_}, {"backup_workers", cfg_.backup_workers},
                        {"consistency", cfg_.consistency}, {"bad_messages", errors}, {"duplicates", duplicates_},
                        {"dc_uncompensated", dc_uncompensated_}, {"update", update_}, {"wire", wire_},
                        {"staleness_histogram", hist}, {"live", live}, {"last_staleness", last_stale_},
                        {"last_seen_s", last_seen_}, {"finished", std::vector<bool>(finished_)},
                        {"reading", std::vector<bool>(reading_)}, {"dc_backup_values", dc_backup_values()}, {"epoch", epoch_}, {"wire_version", wire_version()},
                        {"elastic", elastic_}, {"membership_epoch", membership_epoch_}, {"joining", joining_}, {"rejoining", rejoin_}};
  if (grants_data()) j["data_cursor"] = data_cursor_, j["data_reserved"] = data_reserved_;
  if (now_s >= 0) j["now_s"] = now_s;
  if (unix_us >= 0) j["unix_us"] = unix_us;
  return j.dump();
}

}  // namespace syncopate
