#include "experiments/sim/virtual_cluster.h"

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <sys/resource.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/comm/sharding.h"
#include "common/flat_adamw.h"
#include "common/log.h"
#include "common/outer_optimizer.h"
#include "common/text/tokenizer.h"
#include "experiments/sim/churn_schedule.h"
#include "experiments/sim/event_queue.h"
#include "experiments/sim/network_model.h"
#include "model/flat_parameters.h"
#include "model/gpt.h"
#include "server/consistency_rule.h"
#include "server/parameter_shard.h"
#include "server/ps_client.h"
#include "server/ps_protocol.h"
#include "server/shard_partitions.h"
#include "worker/data/data_config.h"
#include "worker/data/held_out_set.h"
#include "worker/data/window_sampler.h"
#include "worker/sync/bucket_reducer.h"
#include "worker/sync/gradient_sync.h"
#include "worker/train/dropout_seed.h"
#include "worker/train/held_out_loss.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/step_pacer.h"

namespace fs = std::filesystem;

namespace syncopate {

namespace {

constexpr double kHeaderBytes = 128;     // a message's header and framing on the wire (msgpack + ZeroMQ), bytes
constexpr size_t kFlushBytes = 1 << 16;  // a worker's metrics are written out once this much is buffered

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Adds the real seconds of its scope to `into` (the simulator's own accounting of where time goes).
class Stopwatch {
 public:
  explicit Stopwatch(double& into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { into_ += seconds_since(t0_); }

 private:
  double& into_;
  std::chrono::steady_clock::time_point t0_;
};

// The process's peak resident memory so far, bytes (what the memory estimate is checked against).
double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

// 80% of MemAvailable (bytes), or 8 GiB where /proc/meminfo cannot be read.
double default_memory_limit() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return 0.8 * kb * 1024.0;
  return 8.0 * (1 << 30);
}

// The mode of a run as the simulator plays it.
struct Mode {
  bool ring = false;     // dist.mode ring (or none with one worker): every worker steps together
  bool local_sgd = false;  // dist.sync_every > 1: inner steps, then an outer step (ring: synchronous; ps: the shards')
  int64_t every = 1;
};

Mode mode_of(const RunConfig& run) {
  Mode m;
  m.ring = run.dist.mode != "ps";
  m.every = run.dist.sync_every;
  m.local_sgd = m.every > 1;
  return m;
}

struct Event {
  enum Kind : uint8_t {
    kComputeDone, kPushArrive, kReplyArrive, kSyncDone, kFinishArrive, kPushRelease,
    kChurn,   // sim.churn's event number `worker`
    kLaunch,  // churn: worker `worker`'s process starts (a restart or a joiner); it joins sim.restart_s later
    kJoin,    // churn: worker `worker` joins the job (INIT join = 1 then 2 on every part)
    kExpire,  // churn: the shards count out the workers silent for ps.worker_timeout_s
  } kind = kComputeDone;
  int worker = -1, shard = -1;
  int incarnation = 0;  // the worker's process it belongs to: an event of a process that is gone is dropped
  int64_t clock = 0, param_version = 0;
  double lr = 0;
  at::Tensor data;  // kPushArrive / kPushRelease: the pushed slice, held while in flight (or until it leaves)
};
Event event(Event::Kind kind, int worker = -1, int shard = -1) {
  Event e;
  e.kind = kind;
  e.worker = worker;
  e.shard = shard;
  return e;
}

struct Worker {
  int id = 0;
  int64_t steps = 0;  // this worker's budget (train.steps, or sim.slow_steps for a straggler)
  int64_t step = 0;   // steps completed
  std::unique_ptr<StepPacer> pacer;
  at::Tensor params;  // ps and local SGD: the parameters this worker holds (its possibly stale copy)
  at::Tensor start;   // local SGD via ps: the round's start
  std::unique_ptr<FlatAdamW> inner;  // local SGD: the inner AdamW (never synchronized)
  std::vector<int64_t> version;      // ps: the shard version of each slice it holds
  int pending = 0;                   // ps: replies still to come
  double stale_sum = 0, began = 0, computed = 0, modelled = 0, loss = 0, grad_norm = 0, lr = 0, wire = 0;
  int64_t round = -1;                // ps: the smallest round of this step's replies (BSP; -1 otherwise)
  bool done = false;
  // Elastic membership (dist.elastic; sim.churn):
  bool alive = true;                 // its process is up (false: killed, left, or a joiner not launched yet)
  bool joining = false;              // it waits for its join's replies (INIT join = 2 on every part)
  bool in_job = true;                // its current process joined (false while it starts)
  bool exited = false;               // worker 0: its process's end is counted
  double last_seen = 0;              // when the shards last received a message of its current process
  bool leaving = false;              // a SIGTERM came: it leaves at its next step boundary
  double restart_delay_s = 0;        // after it left (SIGTERM), its process is started again this much later
  std::vector<char> join_owed;       // per part: its join's reply is still to come from there
  int incarnation = 0;               // its processes so far (events of an earlier one are dropped)
  int64_t join_clock = 0;            // the clock its join named (local SGD: a round)
  int64_t grant = -1;                // elastic: the first sample of its next step (local SGD: round), from the first part
  int64_t step_data = -1;            // elastic: the first sample of its current step (logged as data_position)
  double launched = 0;               // when its current process was launched
  double lifetime = 0;               // seconds its ended processes were up
  at::Tensor saved_m, saved_v;       // local SGD: the inner AdamW state a restart resumes (its checkpoint)
  int64_t saved_steps = 0;
  std::string path, log;  // metrics.jsonl and the lines not yet written to it
};

class Simulation {
 public:
  Simulation(const RunConfig& run, const PsConfig& ps, const SimConfig& sim, const std::string& out, bool verbose)
      : run_(run), ps_(ps), sim_(sim), out_(out), verbose_(verbose), mode_(mode_of(run)),
        churn_(parse_churn_schedule(sim.churn, sim.workers)),
        n_(static_cast<int>(sim.workers)), k_(mode_.ring ? 0 : static_cast<int>(sim.shard_count())),
        m_(n_ + static_cast<int>(churn_joins(churn_))),
        net_(link_rates(), sim.latency_us * 1e-6, sim.sharing == "fifo", link_of()) {
    if (run_.train.threads > 0) torch::set_num_threads(static_cast<int>(run_.train.threads));
    at::globalContext().setFlushDenormal(sim.flush_denormal);
    tokenizer_ = make_tokenizer(run_.data.tokenizer_config());
    data_ = std::make_unique<TrainingData>(open_training_data(run_.data, *tokenizer_, run_.model.block_size, verbose));
    train_ = std::make_unique<WindowSampler>(data_->train, run_.model.block_size, run_.train.seed, run_.model.vocab_size);
    held_out_ = std::make_unique<HeldOutSet>(
        data_->val, run_.model.block_size,
        run_.eval.val_windows > 0 ? run_.eval.val_windows : run_.eval.batches * run_.train.batch_size,
        static_cast<uint64_t>(run_.eval.val_seed), run_.model.vocab_size);
    torch::manual_seed(static_cast<uint64_t>(run_.train.seed));  // every worker starts from these weights, as rank 0's
    model_ = GPT(run_.model);
    model_->train();
    flat_ = std::make_unique<FlatParameters>(*model_);
    node_clip_ = run_.dist.clip_scope == "node";
    // The ring's buckets as the trainer makes them (RingSync: dist.overlap with the job's clipping
    // scope), all-reduced one after the other as the modelled backward produces them (emulate.overlap).
    if (mode_.ring && !mode_.local_sgd && run_.emulate.overlap && run_.dist.overlap && !node_clip_)
      overlap_bounds_ = bucket_bounds(parameter_ranges(*flat_), run_.dist.first_bucket_kb * 1024 / 4,
                                      run_.dist.bucket_kb * 1024 / 4);
    batch_x_ = torch::empty({run_.train.batch_size, run_.model.block_size}, torch::kLong);
    batch_y_ = torch::empty_like(batch_x_);
    p_ = flat_->numel();
    if (mode_.ring) {
      bounds_ = Sharding::bounds(p_, 1);
    } else {
      bounds_ = PsClient::part_bounds(p_, k_, partition_elems(run_.dist), &server_of_);
      parts_ = static_cast<int>(bounds_.size()) - 1;
      push_in_backward_ = !mode_.local_sgd && run_.dist.ps_push_in_backward && run_.emulate.overlap;
    }
    samples_per_step_ = run_.train.batch_size * run_.train.grad_accum * n_;
    const int64_t tokens_per_replica = run_.train.batch_size * run_.train.grad_accum * run_.model.block_size;
    tokens_per_step_ = mode_.ring && !mode_.local_sgd ? tokens_per_replica * n_ : tokens_per_replica;
    const auto fp32 = at::TensorOptions().dtype(at::kFloat);

    const std::vector<int> slow = sim_.slow_set();
    const std::vector<double> factors = sim_.slowdown_list();
    workers_.resize(static_cast<size_t>(m_));
    for (int r = 0; r < m_; ++r) {
      Worker& w = workers_[static_cast<size_t>(r)];
      w.id = r;
      const bool is_slow = std::binary_search(slow.begin(), slow.end(), r);
      EmulateConfig em = run_.emulate;
      // sim.worker_slowdowns names the first N workers; a joiner (churn) steps at the base step.
      em.slowdown = !factors.empty() ? (r < static_cast<int>(factors.size()) ? factors[static_cast<size_t>(r)] : 1.0)
                    : is_slow       ? run_.emulate.slowdown
                                    : 1.0;
      w.pacer = std::make_unique<StepPacer>(em, static_cast<uint64_t>(run_.train.seed), r);  // the emulation's draws
      w.steps = is_slow && sim_.slow_steps > 0 ? sim_.slow_steps : run_.train.steps;
      w.alive = w.in_job = r < n_;  // a joiner's process is launched by its event
      if (r < n_) job_total_tokens_ += w.steps * tokens_per_step_;
      w.path = (fs::path(out_) / fmt::format("node{}", r) / "metrics.jsonl").string();
      fs::create_directories(fs::path(w.path).parent_path());
      std::ofstream(w.path, std::ios::trunc);
      if (!mode_.ring || mode_.local_sgd) w.params = flat_->params.clone();
      if (mode_.local_sgd) w.inner = std::make_unique<FlatAdamW>(run_.optim, p_, flat_->decay_ranges(), fp32);
      if (mode_.local_sgd && !mode_.ring) w.start = flat_->params.clone();
      if (mode_.local_sgd && !churn_.empty())  // a restart's checkpoint of the inner state; a new node's zeros
        w.saved_m = at::zeros({p_}, fp32), w.saved_v = at::zeros({p_}, fp32);
    }
    if (mode_.ring && !mode_.local_sgd) {
      opt_ = std::make_unique<FlatAdamW>(run_.optim, p_, flat_->decay_ranges(), fp32);
      sum_ = at::zeros({p_}, fp32);
    }
    if (mode_.ring && mode_.local_sgd) {
      start_ = flat_->params.clone();
      sum_ = at::zeros({p_}, fp32);
      scratch_ = at::empty({p_}, fp32);
      outer_ = std::make_unique<OuterOptimizer>(parse_outer_rule(run_.dist.outer), run_.dist.outer_lr,
                                                run_.dist.outer_momentum, p_, fp32);
    }
    if (!mode_.ring) init_shards();
  }

  // The learning rate of w's current step: by its step and budget, or (sim.time_schedule) by the
  // moment the step began on the simulated clock, the schedule ending at sim.time_limit_s.
  double lr_of(const Worker& w) const {
    if (sim_.time_schedule) return lr_at_progress(run_.schedule, run_.optim.lr, w.began / sim_.time_limit_s);
    return lr_at(run_.schedule, run_.optim.lr, w.step, w.steps);
  }

  SimResult run() {
    const auto t0 = std::chrono::steady_clock::now();
    for (Worker& w : workers_)
      if (w.alive) begin(w, sim_.start_s + sim_.spread_start_s * static_cast<double>(w.id) / static_cast<double>(n_));
    int64_t total = 0;
    for (const Worker& w : workers_) total += w.steps;
    int64_t next_report = total / 10;
    while (!queue_.empty() && !stopped_) {
      auto [t, e] = queue_.pop();
      if (sim_.time_limit_s > 0 && t > sim_.time_limit_s) {  // the budget in simulated time is spent
        stopped_ = true;
        result_.ended_by = "time_limit";
        if (sim_.time_schedule) evaluate_at_limit();
        break;
      }
      ++result_.events;
      // A worker's own events of a process that is gone (killed, or left) are dropped; what it sent
      // before (a push, a FINISH on the wire) still arrives.
      const bool own = e.kind == Event::kComputeDone || e.kind == Event::kReplyArrive || e.kind == Event::kPushRelease ||
                       e.kind == Event::kJoin;
      if (own && workers_[static_cast<size_t>(e.worker)].incarnation != e.incarnation) continue;
      switch (e.kind) {
        case Event::kComputeDone: compute_done(workers_[static_cast<size_t>(e.worker)], t); break;
        case Event::kPushArrive: push_arrive(e, t); break;
        case Event::kReplyArrive: reply_arrive(workers_[static_cast<size_t>(e.worker)], t); break;
        case Event::kSyncDone: sync_done(t); break;
        case Event::kFinishArrive: finish_arrive(e, t); break;
        case Event::kPushRelease: push_release(std::move(e), t); break;
        case Event::kChurn: churn_event(static_cast<size_t>(e.worker), t); break;
        case Event::kLaunch: launch(workers_[static_cast<size_t>(e.worker)], t); break;
        case Event::kJoin: join(workers_[static_cast<size_t>(e.worker)], t); break;
        case Event::kExpire: expire(t); break;
      }
      if (verbose_ && result_.worker_steps >= next_report) {
        log::info("[sim] {}/{} worker-steps, simulated {:.2f} s, real {:.1f} s", result_.worker_steps, total, t,
                  seconds_since(t0));
        next_report += std::max<int64_t>(1, total / 10);
      }
    }
    for (Worker& w : workers_) flush(w);
    for (const Worker& w : workers_)
      SYN_CHECK(w.done || stopped_, fmt::format("worker {} stopped at step {} of {} with nothing left to happen", w.id, w.step, w.steps),
                "a deadlock in the modelled protocol (a simulator bug): report the config");
    if (final_pending_ && !stopped_) {  // every worker is done: the shards hold the job's last updates
      evaluate_into_log(workers_[0], queue_.now(), servers_values(), "servers", {{"job_final", true}});
      flush(workers_[0]);
    }
    result_.sim_s = queue_.now();  // (stopped at the target: that moment; at the time limit: the first event past it)
    result_.real_s = seconds_since(t0);
    write_outputs();
    return result_;
  }

 private:
  // The links: one per worker, then (unless the shards share their nodes' links) one per shard.
  std::vector<double> link_rates() const {
    // A measured goodput scales the rates of the mode's exchange: parameter-server messages travel
    // through the model, the ring's all-reduce is ring_s's formula on rate(0).
    const double g = mode_.ring ? sim_.ring_goodput : sim_.ps_goodput;
    const int links = sim_.colocate_servers ? m_ : m_ + k_;
    std::vector<double> r(static_cast<size_t>(links), g * sim_.link_gbit * 1e9 / 8);
    for (int k = m_; k < links; ++k) r[static_cast<size_t>(k)] = g * sim_.server_gbit() * 1e9 / 8;
    return r;
  }
  // Endpoint -> link: workers 0..M-1 (M: with sim.churn's joiners) their own; shard k (endpoint M + k)
  // its own, or node k mod N's (one of the first N).
  std::vector<int> link_of() const {
    std::vector<int> l(static_cast<size_t>(m_ + k_));
    for (int e = 0; e < m_ + k_; ++e) l[static_cast<size_t>(e)] = e < m_ || !sim_.colocate_servers ? e : (e - m_) % n_;
    return l;
  }
  int server_endpoint(int server) const { return m_ + server; }
  int part_endpoint(int part) const { return m_ + server_of_[static_cast<size_t>(part)]; }
  int64_t length(int k) const { return bounds_[static_cast<size_t>(k) + 1] - bounds_[static_cast<size_t>(k)]; }
  at::Tensor slice(const at::Tensor& t, int k) const {
    return t.slice(0, bounds_[static_cast<size_t>(k)], bounds_[static_cast<size_t>(k) + 1]);
  }

  // The shards get worker 0's INIT (the first INIT defines a shard), then every worker registers
  // at clock 0 and holds the initial values, as after its own INIT's reply.
  void init_shards() {
    std::vector<int64_t> pairs;
    for (auto& [o, l] : flat_->decay_ranges()) pairs.insert(pairs.end(), {o, l});
    for (int k = 0; k < k_; ++k) servers_.push_back(std::make_unique<ShardPartitions>(ps_, k, "", 1));
    for (int k = 0; k < parts_; ++k) {
      MsgHeader h;
      h.type = static_cast<int>(MsgType::kInit);
      const int s = server_of_[static_cast<size_t>(k)];  // as PsClient: 0 when the server's range is one part
      h.partition = std::count(server_of_.begin(), server_of_.end(), s) > 1 ? partition_elems(run_.dist) : 0;
      h.worker = 0;
      h.workers = n_;
      h.offset = bounds_[static_cast<size_t>(k)];
      h.length = length(k);
      h.beta1 = run_.optim.beta1;
      h.beta2 = run_.optim.beta2;
      h.eps = run_.optim.eps;
      h.weight_decay = run_.optim.weight_decay;
      h.update = mode_.local_sgd ? run_.dist.outer : "adamw";
      h.outer_lr = run_.dist.outer_lr;
      h.outer_momentum = run_.dist.outer_momentum;
      // (An elastic job's delayed Nesterov: 0, the live members at each arrival, as PsLocalSgdSync.)
      h.outer_delay = run_.dist.outer_delay > 0                                         ? run_.dist.outer_delay
                      : run_.dist.elastic && run_.dist.outer == "delayed_nesterov" ? 0
                                                                                    : n_;
      h.elastic = run_.dist.elastic;
      h.samples = run_.dist.elastic ? samples_per_push() : 0;
      const at::Tensor values = slice(flat_->params, k).contiguous();
      ParameterShard& shard = servers_[static_cast<size_t>(server_of_[static_cast<size_t>(k)])]->init(
          h, values.data_ptr<float>(), pairs.data(), pairs.size() / 2, 0.0);
      if (!run_.dist.elastic)
        for (int r = 0; r < n_; ++r) {
          shard.registered(r, 0);
          shard.seen(r, 0.0);
        }
      shards_.push_back(&shard);
    }
    for (Worker& w : workers_) w.version.assign(static_cast<size_t>(parts_), 0), w.join_owed.assign(static_cast<size_t>(parts_), 0);
    // An elastic job's workers join (INIT join = 1, then 2 at the largest clock) in rank order, as
    // they would one after the other; they start with the initial values, the first part grants
    // each its first step's samples.
    if (run_.dist.elastic)
      for (int r = 0; r < n_; ++r) {
        std::vector<int> released;
        for (ParameterShard* s : shards_) s->join(r, 0, samples_per_push(), 0.0, &released, -1);
        SYN_CHECK(released.empty(), "a first join released a reply", "a simulator bug: report the config");
        workers_[static_cast<size_t>(r)].grant = shards_[0]->grant(r);
      }
  }
  // Elastic: the samples one push stands for (a grant's size): a step's, local SGD a round's.
  int64_t samples_per_push() const {
    return run_.train.batch_size * run_.train.grad_accum * (mode_.local_sgd ? mode_.every : 1);
  }

  void begin(Worker& w, double t) {
    w.began = t;
    // dist.elastic: the step's first sample, from the grant (local SGD: the round's, this inner step's share)
    if (run_.dist.elastic)
      w.step_data = w.grant + (mode_.local_sgd ? w.step % mode_.every : 0) * run_.train.batch_size * run_.train.grad_accum;
    w.modelled = w.pacer->modelled_s(w.step);
    Event e = event(Event::kComputeDone, w.id);
    e.incarnation = w.incarnation;
    queue_.push(t + w.modelled, std::move(e));
    if (push_in_backward_) release_in_backward(w, t);
  }

  // dist.ps_push_in_backward with emulate.overlap (as the trainer with the pacer's gate): each
  // partition's push leaves when the worker's modelled backward has produced it, the last layers'
  // first. The gradient is the one the worker computes on the parameters it holds at the step's
  // start (nothing changes them before its replies come: it waits for them), computed now; no
  // clipping (the trainer refuses ps_push_in_backward with optim.grad_clip).
  void release_in_backward(Worker& w, double t) {
    w.lr = lr_of(w);
    w.loss = gradient(w, w.params);
    w.grad_norm = clip_grad_norm(flat_->grads, 0.0);
    w.pending = parts_;
    w.stale_sum = 0;
    w.round = std::numeric_limits<int64_t>::max();
    w.wire = 0;
    for (int k = parts_ - 1; k >= 0; --k) {
      Event e = event(Event::kPushRelease, w.id, k);
      e.incarnation = w.incarnation;
      e.clock = w.step;
      e.lr = w.lr;
      e.data = slice(flat_->grads, k).clone();
      queue_.push(produced_at(w, bounds_[static_cast<size_t>(k)]), std::move(e));
    }
  }

  // When worker w's modelled backward of this step has produced the gradient from flat offset `from`
  // to the end (backward produces the last parameters' first): StepPacer::produced_share of its
  // modelled step, from the step's start.
  double produced_at(const Worker& w, int64_t from) const {
    const double share = static_cast<double>(p_ - from) / static_cast<double>(p_);
    return w.began + w.modelled * w.pacer->produced_share(share, run_.train.grad_accum);
  }

  // A partition's push leaves now, naming the version of it the worker holds (the step start's).
  void push_release(Event e, double t) {
    Worker& w = workers_[static_cast<size_t>(e.worker)];
    const double bytes = 4.0 * static_cast<double>(length(e.shard)) + kHeaderBytes;
    w.wire += 4.0 * static_cast<double>(length(e.shard));
    e.kind = Event::kPushArrive;
    e.param_version = w.version[static_cast<size_t>(e.shard)];
    queue_.push(net_.send(w.id, part_endpoint(e.shard), bytes, t), std::move(e));
  }

  // Forward and backward of worker w's batch at its current step on `params` (loaded into the
  // model unless they are its own buffer); the gradient is left in flat_->grads. Returns the loss.
  double gradient(const Worker& w, const at::Tensor& params) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!params.is_same(flat_->params)) flat_->params.copy_(params);
    flat_->zero_grad();
    const int64_t b = run_.train.batch_size, accum = run_.train.grad_accum;
    at::Tensor& x = batch_x_;
    at::Tensor& y = batch_y_;
    double loss = 0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      // dist.elastic: the shards' grant (local SGD: the round's, this inner step's share of it), taken
      // whole by the node (one replica); else replica w.id of n_'s share of the job's step.
      const int64_t first = run_.dist.elastic ? WindowSampler::first_sample(w.step_data, micro, 0, 1, b)
                                              : WindowSampler::first_sample(w.step * samples_per_step_, micro, w.id, n_, b);
      train_->fill(first, b, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
      if (run_.model.dropout > 0) model_->seed_dropout(dropout_seed(run_.train.seed, w.id, w.step, micro));
      torch::Tensor l = model_->loss(x, y) / static_cast<double>(accum);
      l.backward();
      loss += l.item<double>();
    }
    result_.gradient_s += seconds_since(t0);
    return loss;
  }

  double evaluate(const at::Tensor& params) {
    const auto t0 = std::chrono::steady_clock::now();
    torch::NoGradGuard no_grad;
    if (!params.is_same(flat_->params)) flat_->params.copy_(params);
    model_->eval();
    const double v = held_out_loss(*held_out_, run_.train.batch_size,
                                   [&](const at::Tensor& x, const at::Tensor& y) { return model_->loss(x, y).item<double>(); });
    model_->train();
    result_.eval_s += seconds_since(t0);
    return v;
  }
  // The weights the job would ship at this moment (as the trainer's GradientSync::shipped): the ring's
  // one set of weights, ring local SGD's outer weights (the round's start), or the shards' current values.
  // The weights the trainer's node scores mid-run (GradientSync::shipped): the ring's replica or
  // local SGD's outer weights; with shards, what they last replied to this worker (local SGD: the
  // round's start it took from them).
  std::pair<at::Tensor, const char*> shipped(const Worker& w) {
    if (mode_.ring) return {mode_.local_sgd ? start_ : flat_->params, mode_.local_sgd ? "outer" : "replica"};
    return {mode_.local_sgd ? w.start : w.params, "servers"};
  }
  // sim.time_schedule: the run's end at the budget scores what the job would ship at that moment (the
  // ring's weights, ring local SGD's outer weights, or the shards' values), logged by worker 0 at
  // exactly sim.time_limit_s ("at_limit"): every configuration read at the budget itself, not at its
  // own last evaluation point before it.
  void evaluate_at_limit() {
    Worker& w0 = workers_[0];
    if (mode_.ring) {
      const auto [weights, of] = shipped(w0);
      evaluate_into_log(w0, sim_.time_limit_s, weights, of, {{"at_limit", true}});
    } else {
      evaluate_into_log(w0, sim_.time_limit_s, servers_values(), "servers",
                        {{"global_tokens", job_tokens_now()}, {"at_limit", true}});
    }
  }
  // The shards' current values (GradientSync::final_weights: node 0's pull at the job's end).
  at::Tensor servers_values() {
    if (!servers_view_.defined()) servers_view_ = at::empty_like(flat_->params);
    for (const auto& s : shards_) servers_view_.narrow(0, s->offset(), s->length()).copy_(s->params());
    return servers_view_;
  }
  // Scores `weights` for worker w at simulated time t into its metrics; sim.target_loss: worker 0
  // reaching it stops the run.
  void evaluate_into_log(Worker& w, double t, const at::Tensor& weights, const char* of, const nlohmann::json& extra) {
    const double vl = evaluate(weights);
    if (w.id == 0) result_.final_val_loss = vl, result_.final_eval_of = of;
    nlohmann::json m = {{"step", w.step}, {"time_s", t}, {"val_loss", vl}, {"tokens", w.step * tokens_per_step_},
                        {"eval_of", of}, {"val_tokens", held_out_->tokens()}, {"val_set", held_out_->digest()},
                        {"eval_s", 0.0}, {"unix_s", t}};
    m.update(extra);
    w.log += m.dump() + "\n";
    if (w.id == 0 && sim_.target_loss > 0 && vl <= sim_.target_loss && result_.target_s < 0) {
      result_.target_s = t;  // time to target: the run has told what it was for
      result_.ended_by = "target";
      stopped_ = true;
    }
  }

  void compute_done(Worker& w, double t) {
    w.computed = t;
    w.lr = lr_of(w);
    const double clip = run_.optim.grad_clip;
    if (mode_.ring && !mode_.local_sgd) {  // every worker on the one set of weights; the ring sums
      w.loss = gradient(w, flat_->params);
      // clip_scope=node: each worker's gradient is clipped before the sum; else the mean is (sync_done)
      if (node_clip_) w.grad_norm = clip_grad_norm(flat_->grads, clip);
      sum_.add_(flat_->grads);
      loss_sum_ += w.loss;
      if (++arrived_ == n_) queue_.push(ring_done_at(t), event(Event::kSyncDone));
      return;
    }
    if (push_in_backward_) return;  // its pushes left during the modelled backward (release_in_backward)
    if (!mode_.local_sgd) {  // ps: clip the node's gradient, push every shard its slice
      w.loss = gradient(w, w.params);
      w.grad_norm = clip_grad_norm(flat_->grads, clip);
      push(w, flat_->grads, w.step, w.lr, t);
      return;
    }
    // Local SGD: the inner step on the worker's own weights, then (every H-th step) the outer one.
    w.loss = gradient(w, w.params);
    w.grad_norm = clip_grad_norm(flat_->grads, clip);
    {
      Stopwatch sw(result_.update_s);
      w.inner->step(w.params, flat_->grads, w.lr);
    }
    if ((w.step + 1) % mode_.every != 0) return complete_step(w, t, 0.0);
    if (mode_.ring) {
      sum_.add_(start_).sub_(w.params);  // its pseudo-gradient
      if (++arrived_ == n_) queue_.push(t + ring_s(), event(Event::kSyncDone));
      return;
    }
    push(w, w.start - w.params, w.step / mode_.every, 0.0, t);  // clock = the round, as PsLocalSgdSync
  }

  double ring_s() const { return ring_allreduce_s(n_, 4.0 * static_cast<double>(p_), net_.rate(0), net_.latency_s()); }
  // When the ring's all-reduce of this step ends, the last worker's compute having ended at t_last.
  // Without overlap: then, plus the whole gradient's ring. With it (overlap_bounds_): the buckets in
  // descending offset (the order backward produces them), each when every worker's modelled backward
  // has produced it (produced_at) and the previous bucket's ring is done, taking its own bytes' ring
  // time; never before t_last.
  double ring_done_at(double t_last) const {
    if (overlap_bounds_.empty()) return t_last + ring_s();
    double end = 0;
    for (size_t b = overlap_bounds_.size() - 1; b-- > 0;) {
      const int64_t lo = overlap_bounds_[b], hi = overlap_bounds_[b + 1];
      double ready = 0;
      for (const Worker& w : workers_) ready = std::max(ready, produced_at(w, lo));
      end = std::max(end, ready) + ring_allreduce_s(n_, 4.0 * static_cast<double>(hi - lo), net_.rate(0), net_.latency_s());
    }
    return std::max(end, t_last);
  }
  double ring_wire_bytes() const { return n_ > 1 ? 2.0 * (n_ - 1) / n_ * 4.0 * static_cast<double>(p_) : 0.0; }

  // The ring's all-reduce has ended: the mean gradient's AdamW step (or the outer step), every worker on.
  void sync_done(double t) {
    const double mean_loss = loss_sum_ / n_;
    if (!mode_.local_sgd) {
      sum_.div_(static_cast<double>(n_));
      const double norm = node_clip_ ? -1 : clip_grad_norm(sum_, run_.optim.grad_clip);
      Stopwatch sw(result_.update_s);
      opt_->step(flat_->params, sum_, workers_[0].lr);
      for (Worker& w : workers_) {
        w.loss = mean_loss;
        if (norm >= 0) w.grad_norm = norm;
        w.wire = ring_wire_bytes();
      }
    } else {
      sum_.div_(static_cast<double>(n_));
      Stopwatch sw(result_.update_s);
      outer_->step(start_, sum_, scratch_);
      for (Worker& w : workers_) {
        w.params.copy_(start_);
        w.wire = ring_wire_bytes();
      }
    }
    sum_.zero_();
    loss_sum_ = 0;
    arrived_ = 0;
    for (Worker& w : workers_) complete_step(w, t, 0.0);
  }

  void push(Worker& w, const at::Tensor& g, int64_t clock, double lr, double t) {
    w.pending = parts_;
    w.stale_sum = 0;
    w.round = std::numeric_limits<int64_t>::max();
    w.wire = 0;
    std::vector<int> to(static_cast<size_t>(parts_));
    std::vector<double> bytes(static_cast<size_t>(parts_));
    for (int k = 0; k < parts_; ++k) {
      to[static_cast<size_t>(k)] = part_endpoint(k);
      bytes[static_cast<size_t>(k)] = 4.0 * static_cast<double>(length(k)) + kHeaderBytes;
      w.wire += 4.0 * static_cast<double>(length(k));
    }
    // Every part at once, as PsClient: one connection (flow) per server, its parts in order on it.
    const bool partitioned = parts_ > k_;
    const std::vector<double> arrive = net_.send_batch(w.id, to, bytes, t, partitioned ? &to : nullptr);
    for (int k = 0; k < parts_; ++k) {
      Event e = event(Event::kPushArrive, w.id, k);
      e.incarnation = w.incarnation;
      e.clock = clock;
      e.param_version = w.version[static_cast<size_t>(k)];
      e.lr = lr;
      e.data = slice(g, k).clone();  // what is on the wire until it lands
      queue_.push(arrive[static_cast<size_t>(k)], std::move(e));
    }
  }

  void push_arrive(const Event& e, double t) {
    MsgHeader h;
    h.type = static_cast<int>(MsgType::kPushPull);
    h.worker = e.worker;
    h.clock = e.clock;
    h.param_version = e.param_version;
    h.offset = bounds_[static_cast<size_t>(e.shard)];
    h.length = length(e.shard);
    h.lr = e.lr;
    h.samples = run_.dist.elastic ? samples_per_push() : 0;
    std::vector<int> ready;
    {
      Stopwatch sw(result_.update_s);
      ready = shards_[static_cast<size_t>(e.shard)]->push(h, e.data.data_ptr<float>(), t);
    }
    if (e.shard == 0) ++pushes_to_first_part_;
    Worker& pusher = workers_[static_cast<size_t>(e.worker)];
    pusher.last_seen = std::max(pusher.last_seen, t);
    // The pusher's process is gone (killed after the push left): its reply goes nowhere.
    if (workers_[static_cast<size_t>(e.worker)].incarnation != e.incarnation)
      ready.erase(std::remove(ready.begin(), ready.end(), e.worker), ready.end());
    reply(e.shard, ready, t, e.worker);
    if (final_pending_ && e.shard == 0) evaluate_while_waiting(t);
  }

  // As the trainer's node 0 while it waits for the others at a parameter-server job's end
  // (GradientSync::final_weights' while_waiting): the evaluation points (eval.every_tokens) the
  // shards' count of the job's tokens passes are scored on the shards' values.
  void evaluate_while_waiting(double t) {
    if (run_.eval.every_tokens <= 0) return;
    const int64_t job_tokens = job_tokens_now();
    Worker& w0 = workers_[0];
    // every worker's last update in: the final evaluation's point, not one while waiting
    if (job_tokens >= job_total_tokens_ || !run_.eval.due(w0.step, w0_eval_job_tokens_, job_tokens)) return;
    evaluate_into_log(w0, t, servers_values(), "servers", {{"global_tokens", job_tokens}, {"while_waiting", true}});
    w0_eval_job_tokens_ = job_tokens;
  }
  // The job's tokens as the shards count them (GradientSync::job_tokens): shard 0's version times
  // the pushes one version stands for (BSP: a clock of the workers but the backups) and their tokens.
  int64_t job_tokens_now() const {
    const int64_t per_version = (ps_.consistency == "bsp" ? n_ - ps_.backup_workers : 1) * (mode_.local_sgd ? mode_.every : 1);
    return shards_[0]->version() * per_version * tokens_per_step_;
  }

  // Shard k answers the workers in `ready` (at once: their replies share its uplink): the values
  // of now go into each worker's copy (it waits, so nothing reads them before the reply lands),
  // the replies travel back.
  // pusher: the worker whose push made the replies (-1: a join, FINISH or expiry released them). With
  // churn, a worker whose process is gone gets nothing, and a joining worker takes only what answers
  // its join: a reply made by someone else's request where its join is owed (as syncopate-server's
  // join_owed; a reply to its own earlier push is not its join's).
  void reply(int k, std::vector<int> ready, double t, int pusher = -1) {
    ready.erase(std::remove_if(ready.begin(), ready.end(),
                               [&](int r) {
                                 Worker& w = workers_[static_cast<size_t>(r)];
                                 if (!w.alive) return true;
                                 if (!w.joining) return false;
                                 if (r == pusher || !w.join_owed[static_cast<size_t>(k)]) return true;
                                 w.join_owed[static_cast<size_t>(k)] = 0;
                                 return false;
                               }),
                ready.end());
    if (ready.empty()) return;
    ParameterShard& s = *shards_[static_cast<size_t>(k)];
    for (int r : ready) {
      Worker& w = workers_[static_cast<size_t>(r)];
      SYN_CHECK(w.pending > 0, fmt::format("shard {} answered worker {}, which waits for nothing", k, r),
                "a simulator bug: report the config");
      slice(w.params, k).copy_(s.params());
      w.version[static_cast<size_t>(k)] = s.version();
      w.stale_sum += static_cast<double>(s.last_staleness(r));
      w.round = std::min(w.round, s.round());  // protocol 9: the reply's round (BSP; -1 otherwise)
      s.pulled(r);
    }
    const std::vector<double> bytes(ready.size(), 4.0 * static_cast<double>(length(k)) + kHeaderBytes);
    const std::vector<double> arrive = net_.send_batch(part_endpoint(k), ready, bytes, t);
    for (size_t i = 0; i < ready.size(); ++i) {
      Event e = event(Event::kReplyArrive, ready[i], k);
      e.incarnation = workers_[static_cast<size_t>(ready[i])].incarnation;
      queue_.push(arrive[i], std::move(e));
    }
  }

  // A worker's FINISH reached server e.shard: every partition of it releases what the worker's
  // leaving completes (BSP/SSP), as syncopate-server's ShardPartitions::finish.
  void finish_arrive(const Event& e, double t) {
    std::map<int, std::vector<int>> released;  // part -> workers
    for (const auto& [shard, worker] : servers_[static_cast<size_t>(e.shard)]->finish(e.worker)) {
      const auto it = std::find(shards_.begin(), shards_.end(), shard);
      SYN_CHECK(it != shards_.end(), "a released partition the simulation does not hold", "a simulator bug");
      released[static_cast<int>(it - shards_.begin())].push_back(worker);
    }
    for (const auto& [part, workers] : released) reply(part, workers, t);
  }

  void reply_arrive(Worker& w, double t) {
    if (--w.pending > 0) return;
    if (w.joining) return joined(w, t);
    SYN_CHECK(w.computed >= w.began, fmt::format("worker {}'s replies all came before its compute ended", w.id),
              "a simulator bug (the last partition leaves at the end of the modelled backward): report the config");
    if (mode_.local_sgd) w.start.copy_(w.params);  // the shards' outer weights: the next round's start
    if (run_.dist.elastic) w.grant = shards_[0]->grant(w.id);  // the next step's (round's) samples
    if (mode_.local_sgd && !churn_.empty()) {  // its checkpoint at the round's end: what a crash resumes
      w.saved_m.copy_(w.inner->exp_avg());
      w.saved_v.copy_(w.inner->exp_avg_sq());
      w.saved_steps = w.inner->steps();
    }
    complete_step(w, t, parts_ ? w.stale_sum / parts_ : 0.0);
  }

  // ---- Elastic membership (sim.churn) ----------------------------------------------------------

  // sim.churn's event i, at t: a crash, a preemption notice, or a new worker's launch. One that finds
  // its worker not up (not launched, gone, or done) is not applied (counted).
  void churn_event(size_t i, double t) {
    const ChurnEvent& c = churn_[i];
    Worker& w = workers_[static_cast<size_t>(c.worker)];
    nlohmann::json rec = {{"i", i}, {"kind", churn_kind_name(c.kind)}, {"t_s", c.t_s}, {"worker", c.worker},
                          {"delay_s", c.delay_s}, {"at_s", t}};
    // A signal reaches any process that is up, whatever it is doing (starting, joining, stepping, leaving).
    const bool up = w.alive && !w.done;
    const bool applies = c.kind == ChurnEvent::Kind::kJoin || (up && !(c.kind == ChurnEvent::Kind::kSigterm && w.leaving));
    rec["applied"] = applies;
    if (applies && c.kind == ChurnEvent::Kind::kKill9)
      rec["state"] = !w.in_job ? "starting" : w.joining ? "joining" : w.leaving ? "leaving" : "stepping";
    churn_log_.push_back(rec);
    if (c.kind == ChurnEvent::Kind::kJoin) return launch_at(w, t);
    if (!applies) return;
    if (c.kind == ChurnEvent::Kind::kSigterm) {
      // It finishes its step (its push and reply; one that is starting or joining, its first), then leaves.
      w.leaving = true;
      w.restart_delay_s = c.delay_s;
      return;
    }
    // kill -9: a step in flight is lost, and local SGD's partial round with it (a round already pushed,
    // waiting for its reply, is at the shards).
    if (w.in_job && !w.joining) {
      ++lost_in_flight_;
      if (mode_.local_sgd && w.pending == 0) lost_partial_ += w.step % mode_.every;
    }
    // The shards last heard of it at its last message or heartbeat (PsClient's, every kHeartbeatS from
    // its launch), whichever is later.
    const double beat = w.launched + std::floor((t - w.launched) / kHeartbeatS) * kHeartbeatS;
    if (beat > w.last_seen && beat > w.launched)
      for (auto& srv : servers_) srv->seen(w.id, beat);
    end_process(w, t);
    if (mode_.local_sgd) {  // it resumes its checkpoint: the inner state at its last round's end
      w.inner->exp_avg().copy_(w.saved_m);
      w.inner->exp_avg_sq().copy_(w.saved_v);
      w.inner->set_steps(w.saved_steps);
    }
    expire_soon(t);  // the shards count it out once silent for ps.worker_timeout_s
    launch_at(w, t + c.delay_s);
  }
  // syncopate-server checks its workers' silence every kExpireCheckS (its poll), the live ones being
  // seen through their heartbeats; while a crashed worker may still be counted, so does the simulation.
  static constexpr double kExpireCheckS = 0.2;
  static constexpr double kHeartbeatS = 1.0;  // PsClient's heartbeat period
  void expire_soon(double t) {
    if (expire_pending_) return;
    expire_pending_ = true;
    queue_.push(t + kExpireCheckS, event(Event::kExpire));
  }
  void end_process(Worker& w, double t) {
    w.alive = false;
    w.in_job = false;
    w.joining = w.leaving = false;
    w.pending = 0;
    ++w.incarnation;
    w.lifetime += t - w.launched;
    flush(w);
  }
  void launch_at(Worker& w, double t) {
    Event e = event(Event::kLaunch, w.id);
    queue_.push(t, std::move(e));
  }
  // The worker's process starts; it joins after its start-up (sim.start_s).
  void launch(Worker& w, double t) {
    SYN_CHECK(!w.alive, fmt::format("worker {} launched while its process is up", w.id), "a simulator bug: report the config");
    w.alive = true;
    w.launched = t;
    ++launches_;
    Event e = event(Event::kJoin, w.id);
    e.incarnation = w.incarnation;
    queue_.push(t + (sim_.restart_s > 0 ? sim_.restart_s : sim_.start_s), std::move(e));
  }
  // INIT join = 1 on every part (the clock each would start it at), then join = 2 at the largest; a
  // part's reply comes at once or (BSP) with the round it is counted from (reply()).
  void join(Worker& w, double t) {
    w.last_seen = t;
    int64_t clock = 0, pushed = -1;
    for (ParameterShard* s : shards_) clock = std::max(clock, s->join_clock(w.id)), pushed = std::max(pushed, s->pushed_clock(w.id));
    w.joining = true;
    w.join_clock = clock;
    w.pending = parts_;
    w.stale_sum = 0;
    w.round = std::numeric_limits<int64_t>::max();
    std::fill(w.join_owed.begin(), w.join_owed.end(), 1);
    for (int k = 0; k < parts_; ++k) {
      std::vector<int> released;
      const bool now = shards_[static_cast<size_t>(k)]->join(w.id, clock, samples_per_push(), t, &released, pushed);
      reply(k, released, t);
      if (now) reply(k, {w.id}, t);
    }
  }
  // Every part answered the join: the worker steps from the clock it joined at (local SGD: a round
  // boundary), on the shards' values, with the samples the first part granted it.
  void joined(Worker& w, double t) {
    w.joining = false;
    w.in_job = true;
    w.step = mode_.local_sgd ? w.join_clock * mode_.every : w.join_clock;
    if (mode_.local_sgd) w.start.copy_(w.params);
    w.grant = shards_[0]->grant(w.id);
    ++joins_;
    w.log += nlohmann::json({{"joined_at_step", w.step}, {"time_s", t}, {"incarnation", w.incarnation}}).dump() + "\n";
    if (w.step >= w.steps) return finish_worker(w, t);  // the job's clocks passed its budget while it was away
    begin(w, t);
  }
  // The shards count out the workers silent for ps.worker_timeout_s (a crashed one); the live ones
  // are seen (their heartbeats). Replies this releases go out.
  void expire(double t) {
    expire_pending_ = false;
    for (const Worker& w : workers_)
      if (w.alive && !w.done)
        for (auto& srv : servers_) srv->seen(w.id, t);
    std::map<int, std::vector<int>> released;  // part -> workers
    for (auto& srv : servers_)
      for (const auto& [shard, worker] : srv->expire(t)) released[part_of(shard)].push_back(worker);
    for (const auto& [part, workers] : released) reply(part, workers, t);
    for (const Worker& w : workers_)  // a crashed worker not back yet: check again
      if (!w.alive && !w.done && w.incarnation > 0) return expire_soon(t);
  }
  int part_of(const ParameterShard* shard) const {
    const auto it = std::find(shards_.begin(), shards_.end(), shard);
    SYN_CHECK(it != shards_.end(), "a released partition the simulation does not hold", "a simulator bug");
    return static_cast<int>(it - shards_.begin());
  }
  // The worker is done with the job (its budget, or the servers' rounds reached it): FINISH to every
  // server, it leaves their count.
  void finish_worker(Worker& w, double t) {
    w.done = true;
    flush(w);
    for (int k = 0; k < k_; ++k)  // FINISH: it leaves the shards' BSP/SSP count
      queue_.push(net_.send(w.id, server_endpoint(k), kHeaderBytes, t), event(Event::kFinishArrive, w.id, k));
    // Its process exits sim.exit_s later; worker 0's only after the job's last update (it waits to score
    // the shards' final values, as the trainer's node 0).
    if (w.id != 0) w.lifetime += t + sim_.exit_s - w.launched;
    for (const Worker& o : workers_)
      if (!o.done) return;
    Worker& w0 = workers_[0];
    if (w0.done && !w0.exited) w0.exited = true, w0.lifetime += t + sim_.exit_s - w0.launched;
  }

  void complete_step(Worker& w, double t, double staleness) {
    ++w.step;
    const int64_t position = w.step * samples_per_step_;
    const double step_s = t - w.began;
    nlohmann::json m = {{"step", w.step}, {"time_s", t}, {"loss", w.loss}, {"lr", w.lr}, {"grad_norm", w.grad_norm},
                        {"staleness", staleness}, {"wire_bytes", w.wire}, {"skipped_steps", 0},
                        {"tokens", w.step * tokens_per_step_}, {"tokens_per_s", tokens_per_step_ / std::max(step_s, 1e-12)},
                        {"step_s", step_s}, {"data_s", 0.0}, {"epoch", train_->epoch(position)},
                        {"compute_s", w.modelled}, {"modelled_s", w.modelled}, {"wait_s", t - w.computed},
                        {"overrun", false}, {"unix_s", t}};
    if (mode_.local_sgd) m["round"] = w.step / mode_.every;
    if (run_.dist.elastic) m["data_position"] = w.step_data;
    w.wire = 0;
    w.log += m.dump() + "\n";
    ++result_.worker_steps;
    // sim.churn's clock: its times count from the moment every first worker has logged its first step
    // (experiments/churn.py's t0).
    if (w.id < n_ && w.step == 1 && w.incarnation == 0 && ++first_steps_ == n_)
      for (size_t i = 0; i < churn_.size(); ++i) queue_.push(t + churn_[i].t_s, event(Event::kChurn, static_cast<int>(i)));
    // As the trainer: a per-step BSP worker behind the servers' rounds ends when they reach its budget
    // (StepSync::job_done; with backup workers its pushes left would all be dropped as late).
    const bool last = w.step >= w.steps || (!mode_.ring && !mode_.local_sgd && w.round >= w.steps);
    // eval.every_tokens as the trainer: the job's tokens from this worker's (times the workers where they step apart).
    const int64_t apart = mode_.ring && !mode_.local_sgd ? 1 : n_;
    const bool eval_due = run_.eval.due(w.step, (w.step - 1) * tokens_per_step_ * apart, w.step * tokens_per_step_ * apart);
    if (w.id < sim_.eval_workers && (last || eval_due)) {
      if (last && w.id == 0 && !mode_.ring) {
        // As the trainer's node 0 at a parameter-server job's end: it waits for every other
        // worker's last update and scores the shards' values then (run(), once all are done).
        final_pending_ = true;
      } else {
        const auto [weights, of] = shipped(w);
        if (w.id == 0 && !mode_.ring) w0_eval_job_tokens_ = job_tokens_now();  // the trainer's global_tokens
        evaluate_into_log(w, t, weights, of, nlohmann::json::object());
        if (stopped_) return;
      }
    }
    if (w.log.size() > kFlushBytes) flush(w);
    if (!last && w.leaving) return leave(w, t);
    if (!last) return begin(w, t);
    finish_worker(w, t);
  }
  // A preempted worker's step is done: it leaves (FINISH; local SGD: its partial round dropped, its
  // inner state checkpointed as it is) and is started again the event's delay later.
  void leave(Worker& w, double t) {
    if (mode_.local_sgd) {
      lost_partial_ += w.step % mode_.every;
      w.saved_m.copy_(w.inner->exp_avg());
      w.saved_v.copy_(w.inner->exp_avg_sq());
      w.saved_steps = w.inner->steps();
    }
    for (int k = 0; k < k_; ++k)
      queue_.push(net_.send(w.id, server_endpoint(k), kHeaderBytes, t), event(Event::kFinishArrive, w.id, k));
    end_process(w, t + sim_.exit_s);  // (its checkpoint and exit)
    launch_at(w, t + sim_.exit_s + w.restart_delay_s);
  }

  // An elastic job's membership account (sim.json "membership"), the quantities experiments/churn.py
  // reports for an emulated run: goodput = useful samples (the pushes part 0 applied, each a grant's
  // samples: not duplicates, not dropped) / the samples the present workers could have computed in
  // their processes' lifetimes (launch to exit or crash) at the modelled step time.
  nlohmann::json membership_json() const {
    double present_s = 0;
    for (const Worker& w : workers_) present_s += w.lifetime;
    const ParameterShard& first = *shards_[0];
    const int64_t applied = pushes_to_first_part_ - first.duplicates() - first.dropped();
    const int64_t step_samples = run_.train.batch_size * run_.train.grad_accum;
    const double present_samples = present_s / run_.emulate.step_time_s * static_cast<double>(step_samples);
    const double useful = static_cast<double>(applied * samples_per_push());
    int64_t applied_events = 0;
    for (const nlohmann::json& r : churn_log_) applied_events += r["applied"].get<bool>() ? 1 : 0;
    return {{"events", churn_log_}, {"events_applied", applied_events}, {"launches", launches_}, {"joins", joins_},
            {"start_s", sim_.start_s}, {"worker_timeout_s", ps_.worker_timeout_s},
            {"pushes_to_first_part", pushes_to_first_part_}, {"duplicates", first.duplicates()}, {"dropped", first.dropped()},
            {"useful_samples", useful}, {"present_s", present_s}, {"present_samples", present_samples},
            {"goodput", present_samples > 0 ? useful / present_samples : 0.0},
            {"lost_steps", {{"in_flight", lost_in_flight_}, {"partial_rounds", lost_partial_}}},
            {"data_cursor", first.data_cursor()}};
  }

  void flush(Worker& w) {
    std::ofstream f(w.path, std::ios::app);
    f << w.log;
    SYN_CHECK(f.good(), fmt::format("cannot write {}", w.path), "check free space and permissions of --out");
    w.log.clear();
  }

  void write_outputs() {
    if (k_) fs::create_directories(fs::path(out_) / "logs");
    double server_bytes = 0, worker_bytes = 0;
    for (int k = 0; k < k_; ++k) {
      write_file_atomic((fs::path(out_) / "logs" / fmt::format("server{}.log", k)).string(),
                        fmt::format("[server {}] stats {}\n", k, servers_[static_cast<size_t>(k)]->stats_json(0, queue_.now(), -1)));
      if (!sim_.colocate_servers) server_bytes += net_.sent(server_endpoint(k));  // (colocated: counted on its node's link below)
    }
    for (int r = 0; r < m_; ++r) worker_bytes += net_.sent(r);
    if (mode_.ring) worker_bytes = ring_wire_bytes() * static_cast<double>(result_.worker_steps) /
                                   static_cast<double>(mode_.every);  // the ring's traffic is modelled, not sent
    const double per = result_.worker_steps ? 1.0 / static_cast<double>(result_.worker_steps) : 0.0;
    result_.tokens = result_.worker_steps * run_.train.batch_size * run_.train.grad_accum * run_.model.block_size;
    result_.bytes_sent = worker_bytes + server_bytes;
    nlohmann::json j = {
        {"workers", n_}, {"servers", k_}, {"params", p_}, {"simulated_s", result_.sim_s}, {"worker_steps", result_.worker_steps},
        {"events", result_.events}, {"real_s", result_.real_s}, {"gradient_s", result_.gradient_s}, {"eval_s", result_.eval_s},
        {"update_s", result_.update_s},
        {"real_s_per_worker_step", result_.real_s * per}, {"gradient_s_per_worker_step", result_.gradient_s * per},
        // What is neither gradients, nor evaluation, nor the update rules: scheduling, links, copies, metrics.
        {"overhead_share", result_.real_s > 0
                               ? (result_.real_s - result_.gradient_s - result_.eval_s - result_.update_s) / result_.real_s
                               : 0.0},
        {"target_loss", sim_.target_loss}, {"target_reached_s", result_.target_s}, {"ended_by", result_.ended_by},
        {"bytes_sent_by_workers", worker_bytes}, {"bytes_sent_by_servers", server_bytes},
        {"memory_estimate_bytes", sim_memory_estimate(run_, ps_, sim_)}, {"peak_rss_bytes", peak_rss_bytes()}};
    if (run_.dist.elastic && k_) j["membership"] = membership_json();
    write_file_atomic((fs::path(out_) / "sim.json").string(), j.dump(2) + "\n");
  }

  RunConfig run_;
  PsConfig ps_;
  SimConfig sim_;
  std::string out_;
  bool verbose_;
  Mode mode_;
  std::vector<ChurnEvent> churn_;  // sim.churn, by time
  int n_, k_;
  int m_;  // worker slots: the first n_ workers, then sim.churn's joiners (endpoints 0..m_-1; shard k is m_ + k)
  NetworkModel net_;
  EventQueue<Event> queue_;
  std::shared_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<TrainingData> data_;
  std::unique_ptr<WindowSampler> train_;
  std::unique_ptr<HeldOutSet> held_out_;  // the same windows for every seed (eval.val_seed)
  at::Tensor servers_view_;               // ps: the shards' values assembled for an evaluation
  GPT model_{nullptr};
  std::unique_ptr<FlatParameters> flat_;
  int64_t p_ = 0, samples_per_step_ = 0, tokens_per_step_ = 0;
  std::vector<int64_t> bounds_;
  std::vector<Worker> workers_;
  // ps: each server as syncopate-server holds its range (ShardPartitions: one partition, or
  // dist.ps_partition_mb's pieces); the parts are what workers push and shards reply, in PsClient's
  // order (part_bounds), part j on server server_of_[j].
  std::vector<std::unique_ptr<ShardPartitions>> servers_;
  std::vector<ParameterShard*> shards_;  // part j's shard
  std::vector<int> server_of_;
  int parts_ = 0;
  std::unique_ptr<FlatAdamW> opt_;           // ring: the one AdamW every worker would apply alike
  std::unique_ptr<OuterOptimizer> outer_;    // ring local SGD: the one outer step
  at::Tensor sum_, start_, scratch_;         // ring: the gradients' (or pseudo-gradients') sum; local SGD's round start
  double loss_sum_ = 0;
  int arrived_ = 0;
  bool stopped_ = false;  // sim.target_loss reached, or sim.time_limit_s passed
  bool final_pending_ = false;  // ps: worker 0 finished; its final evaluation waits for the others
  int64_t job_total_tokens_ = 0;   // every worker's steps x tokens per step: the job's tokens at its end
  int64_t w0_eval_job_tokens_ = 0;  // ps: the job's tokens at worker 0's last evaluation point (as it counts them)
  bool node_clip_ = false;  // ring: dist.clip_scope=node (each worker's gradient clipped, not the mean)
  std::vector<int64_t> overlap_bounds_;  // ring with overlap: the buckets' ascending bounds (empty: no overlap)
  bool push_in_backward_ = false;        // ps with ps_push_in_backward and emulate.overlap: pushes leave in backward
  at::Tensor batch_x_, batch_y_;  // one micro-batch's ids [batch, context], reused by every gradient
  SimResult result_;
  // Elastic membership (sim.churn): what happened, and what it cost.
  nlohmann::json churn_log_ = nlohmann::json::array();  // per sim.churn event: when, and whether it found its worker up
  int64_t launches_ = 0, joins_ = 0;       // processes launched after the start; joins completed after it
  int64_t lost_in_flight_ = 0;             // steps in flight at a crash
  int64_t lost_partial_ = 0;               // local SGD: inner steps of partial rounds dropped (crash or preemption)
  int64_t pushes_to_first_part_ = 0;       // pushes that reached part 0 (each a step's or a round's samples)
  bool expire_pending_ = false;            // a silence check is scheduled
  int first_steps_ = 0;                    // the first workers that logged their first step (sim.churn's clock starts then)
};

}  // namespace

std::vector<int> SimConfig::slow_set() const {
  std::set<int> s;
  std::stringstream ss(slow_workers);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SYN_CHECK(used == item.size() && v >= 0 && v < workers,
              fmt::format("sim.slow_workers entry '{}' is not a worker index 0..{}", item, workers - 1),
              "list worker indices separated by commas, e.g. --sim.slow_workers=7 or 0,5");
    s.insert(v);
  }
  const auto share = static_cast<int64_t>(std::ceil(slow_share * static_cast<double>(workers) - 1e-9));
  for (int64_t r = workers - share; r < workers; ++r) s.insert(static_cast<int>(r));
  return {s.begin(), s.end()};
}

std::vector<double> SimConfig::slowdown_list() const {
  std::vector<double> out;
  if (worker_slowdowns.empty()) return out;
  std::stringstream ss(worker_slowdowns);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SYN_CHECK(used == item.size() && !item.empty() && std::isfinite(v) && v >= 0.01 && v <= 1000,
              fmt::format("sim.worker_slowdowns entry {} '{}' is not a step-time factor in [0.01, 1000]", out.size(), item),
              "give one factor per worker separated by commas, e.g. --sim.worker_slowdowns=1,1,1,1.4");
    out.push_back(v);
  }
  SYN_CHECK(static_cast<int64_t>(out.size()) == workers,
            fmt::format("sim.worker_slowdowns has {} factor(s) for sim.workers={}", out.size(), workers),
            "give exactly one factor per worker (1 for a node at the base step)");
  return out;
}

void SimConfig::validate() const {
  slow_set();
  slowdown_list();
  SYN_CHECK(worker_slowdowns.empty() || (slow_workers.empty() && slow_share == 0),
            "sim.worker_slowdowns with sim.slow_workers or sim.slow_share",
            "give every worker's factor in sim.worker_slowdowns, or the stragglers in sim.slow_workers, not both");
  SYN_CHECK(eval_workers <= workers, fmt::format("sim.eval_workers={} but sim.workers={}", eval_workers, workers),
            "evaluate on at most every worker (1 = worker 0 only, what the studies read)");
  SYN_CHECK(servers <= workers * 64, fmt::format("sim.servers={} for {} workers", servers, workers),
            "at most 64 shards per worker");
  SYN_CHECK(!colocate_servers || server_link_gbit == 0,
            fmt::format("sim.colocate_servers=true with sim.server_link_gbit={}", server_link_gbit),
            "shards on the workers' nodes use the nodes' links (sim.link_gbit): drop sim.server_link_gbit");
  SYN_CHECK(!time_schedule || time_limit_s > 0, "sim.time_schedule=true without sim.time_limit_s",
            "a schedule by the clock ends at the budget: set --sim.time_limit_s to it (simulated seconds)");
}

double sim_memory_estimate(const RunConfig& run, const PsConfig& ps, const SimConfig& sim) {
  const double p4 = 4.0 * static_cast<double>(gpt_num_params(run.model));
  const Mode m = mode_of(run);
  const double n = static_cast<double>(sim.workers);
  const double b = static_cast<double>(run.train.batch_size), T = static_cast<double>(run.model.block_size);
  const double C = static_cast<double>(run.model.n_embd), L = static_cast<double>(run.model.n_layer);
  // Activations kept for backward (about 34 values per token per width per layer, plus the logits
  // and their gradient), and the process itself.
  const double activations = 4.0 * b * T * (34.0 * C * L + 3.0 * static_cast<double>(run.model.padded_vocab()));
  double bytes = 512.0 * (1 << 20) + activations + 6.0 * p4;  // LibTorch and data (measured ~0.4 GiB), model, gradient, AdamW, sum
  double per_worker = 4096 + std::min<double>(kFlushBytes, 400.0 * static_cast<double>(run.train.steps));
  if (!m.ring) per_worker += 2.0 * p4;              // its copy of the parameters, its push in flight
  if (m.local_sgd) per_worker += (m.ring ? 3.0 : 4.0) * p4;  // its weights, AdamW moments (and round start)
  bytes += n * per_worker;
  if (!m.ring) {
    bytes += 5.0 * p4;                                                  // the shards: values, moments, sums, outer state
    if (ps.mitigation == "dc_asgd") bytes += n * ParameterShard::kBackupsPerWorker * p4;  // a backup per worker read
  }
  return bytes;
}

void validate_simulation(const RunConfig& run_in, const PsConfig& ps, const SimConfig& sim) {
  RunConfig run = run_in;
  if (run.dist.mode == "ps" && run.dist.servers.empty()) run.dist.servers = "sim";  // the shards are virtual
  run.validate();
  sim.validate();
  const Mode m = mode_of(run);
  SYN_CHECK(run.dist.mode != "none" || sim.workers == 1,
            fmt::format("dist.mode=none with sim.workers={}", sim.workers),
            "choose how the workers synchronize: --dist.mode=ring or --dist.mode=ps");
  SYN_CHECK(run.emulate.enabled(), "the simulator needs a modelled step time",
            "set --emulate.step_time_s (simulated seconds of one step's compute at slowdown 1), or emulate.target_params "
            "with target_tokens to derive it");
  run.emulate.validate();
  // emulate.overlap: the ring's buckets overlap the modelled backward (dist.overlap, clip_scope job) as
  // in the trainer; parameter-server pushes overlap only with ps_push_in_backward, refused below.
  SYN_CHECK(run.dist.wire == "f32", fmt::format("dist.wire={} in the simulator", run.dist.wire),
            "the simulator models float32 gradients only; compressed wires run on the emulated cluster "
            "(scripts/local_cluster.sh)");
  SYN_CHECK(!run.dist.ps_overlap, "dist.ps_overlap in the simulator",
            "the simulator models a step's push during or after its own compute, not during the next step's: leave it off");
  SYN_CHECK(!run.dist.ps_push_in_backward || run.emulate.overlap,
            "dist.ps_push_in_backward without emulate.overlap in the simulator",
            "the simulator releases each push at the modelled moment backward produces it: set --emulate.overlap=true");

  SYN_CHECK(!sim.time_schedule || run.schedule.warmup_frac > 0, "sim.time_schedule=true with schedule.warmup_frac=0",
            "a schedule by the clock warms up over a share of the budget: set --schedule.warmup_frac (e.g. 0.05)");
  SYN_CHECK(run.train.device != "cuda", "train.device=cuda in the simulator",
            "the simulator computes gradients on the CPU, one worker at a time: use --train.device=cpu or auto");
  SYN_CHECK(sim.worker_slowdowns.empty() || run.emulate.slowdown == 1.0,
            fmt::format("sim.worker_slowdowns with emulate.slowdown={}", run.emulate.slowdown),
            "each worker's factor is in sim.worker_slowdowns: leave emulate.slowdown at 1");
  SYN_CHECK(!(m.ring && sim.slow_steps > 0), "sim.slow_steps with a ring",
            "a ring steps together, so every worker runs train.steps; an elastic budget is for modes that wait for "
            "no straggler (ps asp, bsp with backup workers)");
  SYN_CHECK(!(m.ring && m.local_sgd && run.dist.outer == "delayed_nesterov"),
            "dist.outer=delayed_nesterov with a ring", "a ring applies one outer step per round: use nesterov or average");
  SYN_CHECK(run.emulate.latency_ms == 0, fmt::format("emulate.latency_ms={} in the simulator", run.emulate.latency_ms),
            "the simulator's links take their latency from --sim.latency_us (one way, every message): set that instead");
  SYN_CHECK(!(m.ring && run.dist.elastic), "dist.elastic with a ring in the simulator",
            "the simulator models elastic membership on parameter servers only; an elastic ring runs on the emulated cluster "
            "(experiments/churn.py)");
  const std::vector<ChurnEvent> churn = parse_churn_schedule(sim.churn, sim.workers);
  SYN_CHECK(churn.empty() || run.dist.elastic, "sim.churn without dist.elastic",
            "membership events need an elastic job: add --dist.elastic=true (and --dist.mode=ps)");
  SYN_CHECK(churn.empty() || ps.worker_timeout_s > 0, "sim.churn with ps.worker_timeout_s=0",
            "a crashed worker is counted out after ps.worker_timeout_s: set it > 0");
  SYN_CHECK(sim.workers + churn_joins(churn) <= ParameterShard::kMaxWorkers,
            fmt::format("{} workers and {} joins", sim.workers, churn_joins(churn)), "at most 4096 workers in all");
  if (!m.ring) {
    parse_consistency(ps.consistency);
    parse_mitigation(ps.mitigation);
    make_consistency_rule(ps, static_cast<int>(sim.workers));  // backup workers fewer than workers, etc.
    SYN_CHECK(sim.shard_count() <= gpt_num_params(run.model),
              fmt::format("sim.servers={} for a model of {} parameters", sim.shard_count(), gpt_num_params(run.model)),
              "use fewer shards than parameters");
    const int64_t shard_values = (gpt_num_params(run.model) + sim.shard_count() - 1) / sim.shard_count();
    const int64_t per = partition_elems(run.dist);
    SYN_CHECK(per == 0 || (shard_values + per - 1) / per <= kMaxPartitionsPerServer,
              fmt::format("shards of up to {} values cut into dist.ps_partition_mb={} partitions: more than {} per server",
                          shard_values, run.dist.ps_partition_mb, kMaxPartitionsPerServer),
              "raise dist.ps_partition_mb (syncopate-server refuses as many)");
  }
  const double need = sim_memory_estimate(run, ps, sim);
  const double limit = sim.memory_gb > 0 ? sim.memory_gb * (1 << 30) : default_memory_limit();
  SYN_CHECK(need <= limit,
            fmt::format("this simulation needs about {:.1f} GiB ({} workers, {} parameters, mode {}{}) but {:.1f} GiB are "
                        "allowed",
                        need / (1 << 30), sim.workers, gpt_num_params(run.model), run.dist.mode,
                        m.local_sgd ? ", local SGD" : "", limit / (1 << 30)),
            "use fewer workers or a smaller model (--model.preset=micro), or raise --sim.memory_gb if the machine has it");
}

SimResult run_simulation(const RunConfig& run, const PsConfig& ps, const SimConfig& sim, const std::string& out,
                         bool verbose) {
  validate_simulation(run, ps, sim);  // callers other than the CLI get the same refusals
  Simulation s(run, ps, sim, out, verbose);
  return s.run();
}

}  // namespace syncopate
