#include "worker/train/trainer.h"

#include <optional>
#include <chrono>
#include <cmath>
#include <mutex>
#include <filesystem>
#include <thread>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/text/tokenizer.h"
#include "common/check.h"
#include "common/splitmix64.h"
#include "common/comm/job_token.h"
#include "common/comm/local_group.h"
#include "common/comm/node_allreduce.h"
#include "common/comm/rendezvous.h"
#include "common/comm/rendezvous_session.h"
#include "common/trace.h"
#include "common/comm/cuda_device.h"
#include "common/crash_point.h"
#include "common/stop_signal.h"
#include "worker/train/determinism.h"
#include "worker/train/held_out_loss.h"
#include "worker/train/precision.h"
#include "common/flat_adamw.h"
#include "common/log.h"
#include "model/flat_parameters.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/data/data_config.h"
#include "worker/data/held_out_set.h"
#include "worker/data/window_sampler.h"
#include "worker/metrics/metrics_log.h"
#include "worker/sync/gradient_sync.h"
#include "worker/sync/advice.h"
#include "worker/train/advice_watch.h"
#include "worker/train/readvise.h"
#include "worker/train/mode_switch.h"
#include "worker/train/autocast.h"
#include "worker/train/dropout_seed.h"
#include "worker/train/step_pacer.h"

namespace fs = std::filesystem;

namespace syncopate {

struct Trainer::Impl {
  RunConfig cfg;
  std::string out;
  bool verbose;
  torch::Device device{torch::kCPU};
  bool bf16 = false;
  GPT model{nullptr};
  std::unique_ptr<FlatParameters> flat;
  // Declared before sync: a BucketReducer's communication thread may pass the pacer's gate until
  // sync is destroyed.
  std::unique_ptr<StepPacer> pacer;  // modelled compute time per step (emulate.*); measures only when off
  std::unique_ptr<GradientSync> sync;  // average, clip, update: this mode's step synchronization
  std::shared_ptr<Tokenizer> tokenizer;  // the node's, shared by its local replicas (read-only)
  std::shared_ptr<TrainingData> data;
  std::unique_ptr<WindowSampler> train_sampler;
  std::unique_ptr<HeldOutSet> held_out;  // the evaluation's windows: the same for every seed (eval.val_seed)
  // eval.defer: the shipped weights at each evaluation point, scored after the last step.
  struct Snapshot {
    torch::Tensor weights;  // host copy; undefined when spilled to `file`
    nlohmann::json record;  // step, tokens, time_s, eval_of, ... (val_loss added when scored)
    std::string file;       // beyond eval.defer_memory_mb: the weights as raw float32 here, removed once scored
  };
  std::vector<Snapshot> snapshots;
  int64_t snapshot_bytes = 0;  // held in memory by `snapshots`
  int64_t spilled = 0;         // snapshots written to disk so far (their file names)
  int64_t last_eval_global_tokens = 0;  // the job's tokens (global_tokens) at the last evaluation point
  int64_t data_position = 0;  // training samples consumed by this worker's steps so far (see WindowSampler)
  std::unique_ptr<MetricsLog> metrics;
  int64_t step = 0;
  int64_t tokens = 0;
  int64_t skipped_steps = 0, skipped_in_a_row = 0;  // updates skipped by the finite-update guard
  double time_offset = 0;  // training seconds before a resume
  std::string config_toml;
  JobMembership* membership;  // the node's group and ring: aborted as soon as this replica fails
  int local_index;

  Impl(const RunConfig& c, const std::string& out_dir, bool resume, const std::string& toml, JobMembership& job,
       int local, bool verb)
      : cfg(c), out(out_dir), verbose(verb), config_toml(toml), membership(&job), local_index(local) {
    cfg.validate();
    const int dev = job.devices.empty() ? -1 : job.devices.at(static_cast<size_t>(local));
    if (dev >= 0) device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dev));
    SYN_CHECK(cfg.train.precision != "bf16" || device.is_cuda(), "train.precision=bf16 needs a CUDA device",
              "use precision auto or fp32 on CPU");
    const PrecisionChoice precision =
        choose_precision(cfg.train.precision, device.is_cuda(), device.is_cuda() ? cuda_compute_capability(dev) : -1);
    bf16 = precision.bf16;
    if (!precision.note.empty() && local == 0) log::warn("[train] {}", precision.note);

    tokenizer = job.tokenizer;
    data = job.data;
    train_sampler = std::make_unique<WindowSampler>(data->train, cfg.model.block_size, cfg.train.seed, cfg.model.vocab_size);
    const int64_t val_windows = cfg.eval.val_windows > 0 ? cfg.eval.val_windows : cfg.eval.batches * cfg.train.batch_size;
    held_out = std::make_unique<HeldOutSet>(data->val, cfg.model.block_size, val_windows,
                                            static_cast<uint64_t>(cfg.eval.val_seed), cfg.model.vocab_size);

    {
      // Local replicas build their models on threads of one process: one at a time, so that each
      // draws its initial weights from the seed alone (the global generator is shared).
      static std::mutex init_mu;
      std::lock_guard<std::mutex> l(init_mu);
      torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
      model = GPT(cfg.model);
    }
    model->to(device);
    model->train();
    flat = std::make_unique<FlatParameters>(*model);
    SyncSetup setup;
    setup.dist = cfg.dist;
    setup.optim = cfg.optim;
    setup.local = local;
    setup.local_size = job.local_size;
    setup.device = dev;
    setup.ring = job.ring;
    setup.group = job.group;
    setup.token = job.token;
    setup.skip_grad_norm = cfg.train.skip_grad_norm;
    setup.model_digest = cfg.model_fingerprint();
    setup.samples_per_step = cfg.train.batch_size * cfg.train.grad_accum * job.local_size;
    setup.job_steps = cfg.train.steps;
    setup.tokens_per_sample = cfg.model.block_size;
    setup.session = job.session;
    setup.ring_latency_s = cfg.emulate.latency_ms / 1e3;
    sync = make_gradient_sync(setup, *flat, model->parameters());
    writer = sync->local_rank() == 0;
    if (writer && cfg.checkpoint.background)
      background_writer = std::make_unique<CheckpointWriter>((fs::path(out) / "checkpoints").string(), cfg.checkpoint.keep,
                                                             cfg.emulate.checkpoint_s);
    verbose = verbose && sync->rank() == 0;  // rank 0 prints, local replica 0 of every node writes outputs

    bool recount_tokens = false;  // (mode_switch.h)
    const std::string ckroot = (fs::path(out) / "checkpoints").string();
    SYN_CHECK(!resume || !job.checkpoints.empty(), fmt::format("--resume given but '{}' holds no checkpoint", ckroot),
              "run without --resume to start fresh, or point --out at the run to resume");
    if (job.resume_step >= 0) {
      const std::string dir = checkpoint_dir(ckroot, job.resume_step);
      // Another synchronization than the checkpoint's (a new advice's pick): what carries over is
      // said once per node; the new synchronization's own state starts at the loaded weights.
      const ModeSwitch switched = mode_switch(read_checkpoint_meta(dir), cfg.dist);
      if (switched.switched && writer) log::warn("[checkpoint] {}", switched.summary());
      // (Into per-step ps from a mode whose nodes held AdamW: its state goes to the shards with INIT.)
      FlatAdamW* into = sync->optimizer();
      if (!into && switched.to_shards) into = sync->carried_optimizer();
      auto meta = load_checkpoint(dir, *model, into, sync->state(), switched.switched);
      if (switched.fresh_sync_state) sync->restart_state(flat->params);
      recount_tokens = switched.recount_tokens;
      step = meta.at("step").get<int64_t>();
      tokens = meta.at("tokens").get<int64_t>();
      time_offset = meta.value("time_s", 0.0);
      data_position = meta.at("data").value("position", int64_t{-1});  // -1: older checkpoint, derived below
      const int64_t newest = job.checkpoints.empty() ? step : job.checkpoints.back();
      if (verbose)
        log::info("[train] resumed from {} (step {}{})", dir, step,
                  step < newest ? fmt::format("; the newest checkpoint every node holds, local step {} ignored", newest)
                                : "");
    }
    if (data_position < 0) data_position = step * samples_per_step();

    pacer = std::make_unique<StepPacer>(cfg.emulate, static_cast<uint64_t>(cfg.train.seed), cfg.dist.node_rank);
    if (cfg.emulate.overlap)
      sync->set_release_gate([p = pacer.get(), k = cfg.train.grad_accum](double done) { p->wait_until_produced(done, k); });
    // Fault injection (tests, scripts/gpu_check.sh): this replica fails once built, before the first
    // collective; the node's other replicas, waiting in start()'s, must end with its cause.
    if (fail_point("start", fmt::format("replica{}", local).c_str(), step))
      SYN_FAIL("injected failure before start (SYNCOPATE_FAIL_AT)", "a test asked for it");
    sync->start(flat->params, step);  // every replica from the same weights (rank 0's, or the servers')
    if (const int64_t joined = sync->joined_step(); joined >= 0 && joined != step) {  // dist.elastic: the job's clock
      if (writer)
        log::info("[train] node {} joined the running job at step {} ({})", cfg.dist.node_rank, joined,
                  job.resume_step >= 0 ? fmt::format("its checkpoint was at step {}", step) : "from the servers' weights");
      step = joined;
    }
    // The elastic ring forms here: every member takes the state of the one furthest along (a
    // joiner: the running job's; a job whose nodes all restart: the newest checkpoint any holds).
    const int64_t step_before_joining = step;
    if (const auto p = sync->regroup(flat->params, {step, tokens, data_position})) {
      if (writer && p->step != step)
        log::info("[train] node {} joined the running job at step {} ({})", cfg.dist.node_rank, p->step,
                  job.resume_step >= 0 ? fmt::format("its checkpoint was at step {}", step) : "from a member's state");
      step = p->step, tokens = p->tokens, data_position = p->data_position;
    }
    // The checkpoint's count meant another thing (job-wide or per node; mode_switch.h): it restarts in
    // this run's meaning, once the job's size is known (an elastic ring's after its first formation);
    // a node that joined a running job (an elastic ring's member further along) has the job's count.
    if (recount_tokens && step == step_before_joining)
      tokens = step * cfg.train.batch_size * cfg.train.grad_accum * cfg.model.block_size * sync->replicas_per_step();
    // Every local replica built and holding those weights on its device before any step starts
    // (NCCL's broadcast is asynchronous: by itself it is no barrier).
    if (job.group) job.group->barrier(local);
    if (writer) {
      write_file_atomic((fs::path(out) / "config.toml").string(), config_toml);
      metrics = std::make_unique<MetricsLog>((fs::path(out) / "metrics.jsonl").string(), resume ? step : -1);
      const fs::path advice = fs::path(out) / kAppliedAdviceFile;  // --dist.mode=auto: watch for drift from it
      if (fs::exists(advice)) {
        advice_watch = std::make_unique<AdviceWatch>(advised_node(advice.string(), cfg.dist.node_rank));
        if (advice_watch->expected_step_s() <= 0) {
          log::warn("[advice] {} assumes no step time for this node: no drift is watched", advice.string());
          advice_watch.reset();
        }
      }
    }
    // dist.readvise_every: every replica takes part in the job's decisions (readvise.h), where the
    // mode has a job-wide collective; elsewhere the run says so once and only watches.
    const fs::path applied = fs::path(out) / kAppliedAdviceFile;
    if (cfg.dist.readvise_every > 0 && fs::exists(applied)) {
      if (sync->job_sum())
        readvise = std::make_unique<Readvise>(out, sync->rank() == 0, read_file(applied.string()));
      else if (writer)
        log::warn("[advice] dist.readvise_every={}: the job cannot re-decide in {} (its nodes never stand at one step "
                  "together{}): it runs as advised, and logs drift only", cfg.dist.readvise_every,
                  cfg.dist.elastic ? "the elastic " + cfg.dist.mode : cfg.dist.mode,
                  cfg.dist.elastic ? ", or its membership changes" : "");
    }
  }

  // Samples one optimizer step takes from the data order: every replica's micro-batches (see WindowSampler).
  int64_t samples_per_step() const { return cfg.train.batch_size * cfg.train.grad_accum * sync->world(); }
  bool writer = true;  // local replica 0: writes metrics, samples and checkpoints for its node
  std::unique_ptr<CheckpointWriter> background_writer;  // checkpoint.background (writer only)
  std::unique_ptr<AdviceWatch> advice_watch;  // --dist.mode=auto: the run against its advice (writer only)
  std::unique_ptr<Readvise> readvise;  // dist.readvise_every: the job's decisions to re-advise and switch (every replica)
  std::string switch_to;               // the advice the job stops to switch to (set at a decision step)

  std::pair<torch::Tensor, torch::Tensor> batch(const WindowSampler& sampler, int64_t first, int64_t b) {
    const int64_t T = cfg.model.block_size;
    // For a GPU the batch is assembled in pinned memory, so that the copy really is asynchronous
    // (from pageable memory non_blocking is ignored and the host waits). LibTorch's caching host
    // allocator reuses a pinned block only once the copy that read it has completed, so the next
    // micro-batch fills another block while this one is still in flight (double buffering).
    const auto opt = torch::TensorOptions().dtype(torch::kLong).pinned_memory(device.is_cuda());
    auto x = torch::empty({b, T}, opt), y = torch::empty({b, T}, opt);
    sampler.fill(first, b, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    return {x.to(device, /*non_blocking=*/true), y.to(device, true)};
  }

  // Mean loss per token over the held-out set, of the model's current weights.
  double evaluate() {
    torch::NoGradGuard no_grad;
    model->eval();
    const double v = held_out_loss(*held_out, cfg.train.batch_size,
                                   [&](const at::Tensor& x, const at::Tensor& y) {
                                     AutocastGuard ac(bf16);
                                     return model->loss(x.to(device), y.to(device)).item<double>();
                                   });
    model->train();
    return v;
  }
  // The loss of `weights` (a flat vector like flat->params, on any device): swapped into the model
  // for the evaluation, the model's own weights restored after.
  double evaluate_weights(const torch::Tensor& weights) {
    if (weights.data_ptr() == flat->params.data_ptr()) return evaluate();
    torch::NoGradGuard no_grad;
    torch::Tensor own = flat->params.clone();
    flat->params.copy_(weights);
    const double v = evaluate();
    flat->params.copy_(own);
    return v;
  }
  // What every evaluation record says of the set it was scored on.
  void describe_held_out(nlohmann::json& m) const {
    m["val_tokens"] = held_out->tokens();
    m["val_set"] = held_out->digest();
  }
  // Scores the deferred snapshots (eval.defer) after the last step, in order, into metrics.jsonl.
  void score_snapshots(Progress& progress) {
    for (Snapshot& s : snapshots) {
      const double t = now_seconds();
      if (!s.file.empty()) s.weights = read_spilled(s.file);
      const double vl = evaluate_weights(s.weights);
      if (!s.file.empty()) fs::remove(s.file), s.weights = torch::Tensor();
      s.record["val_loss"] = vl;
      s.record["deferred_eval_s"] = now_seconds() - t;
      metrics->write(s.record);
      if (verbose)
        progress.line(fmt::format("[eval] step {} ({} weights, scored after training): val loss {:.4f}",
                                  s.record.at("step").get<int64_t>(), s.record.at("eval_of").get<std::string>(), vl));
    }
    snapshots.clear();
    snapshot_bytes = 0;
    std::error_code ec;
    fs::remove(fs::path(out) / "deferred", ec);  // (only if empty; absent when nothing was spilled)
  }
  // eval.defer: keeps a host copy of `weights` with its record, in memory up to eval.defer_memory_mb,
  // beyond that in OUT/deferred/ (written whole before the run goes on).
  void keep_snapshot(const torch::Tensor& weights, const nlohmann::json& record) {
    torch::Tensor host = weights.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    const int64_t bytes = host.numel() * static_cast<int64_t>(host.element_size());
    if (snapshot_bytes + bytes <= cfg.eval.defer_memory_mb * (int64_t{1} << 20)) {
      snapshot_bytes += bytes;
      snapshots.push_back({host, record, ""});
      return;
    }
    const fs::path dir = fs::path(out) / "deferred";
    fs::create_directories(dir);
    const std::string file = (dir / fmt::format("snapshot_{:06d}.f32", spilled++)).string();
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char*>(host.data_ptr()), static_cast<std::streamsize>(bytes));
    f.close();
    SYN_CHECK(f.good(), fmt::format("cannot write the deferred evaluation snapshot {} ({} bytes)", file, bytes),
              "free disk space under --out, raise eval.defer_memory_mb, or set eval.defer=false");
    snapshots.push_back({torch::Tensor(), record, file});
  }
  torch::Tensor read_spilled(const std::string& file) const {
    torch::Tensor t = torch::empty({flat->params.numel()}, torch::kFloat);
    std::ifstream f(file, std::ios::binary);
    f.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * 4));
    SYN_CHECK(f.good() && f.gcount() == t.numel() * 4, fmt::format("cannot read the deferred evaluation snapshot {}", file),
              "it was written by this run under --out/deferred/: check the disk");
    return t;
  }

  std::string sample_text() {
    std::vector<int64_t> ids;
    for (int32_t id : tokenizer->encode(cfg.eval.sample_prompt)) ids.push_back(id);
    if (ids.empty()) ids.push_back(std::max<int64_t>(tokenizer->eod(), 0));
    return tokenizer->decode(generate(*model, ids, cfg.eval.sample_tokens, SamplingOptions{}));
  }

  nlohmann::json meta(double elapsed) const {
    return {{"step", step}, {"tokens", tokens}, {"time_s", elapsed}, {"config", config_toml},
            {"data", {{"train", data->train.describe()}, {"val", data->val.describe()}, {"position", data_position},
                      {"epoch", train_sampler->epoch(data_position)}, {"seed", cfg.train.seed}}}};
  }

  static bool due(int64_t step, int64_t every, int64_t last) { return step == last || (every > 0 && step % every == 0); }

  void run(int64_t stop_at) {
    try {
      run_steps(stop_at);
    } catch (...) {
      // The node's group (and ring) first, before anything here waits on the device: the other
      // replicas must not wait for this one, and a collective it left half-done must end.
      membership->abort_failed_replica(local_index);
      // A failed run still reports the evaluations it snapshotted (eval.defer) before it stops.
      if (writer && !snapshots.empty()) {
        try {
          Progress quiet(0, 1);
          verbose = false;
          score_snapshots(quiet);
        } catch (const std::exception& e) {
          log::warn("[eval] could not score the deferred evaluations after the failure: {}", e.what());
        }
      }
      throw;
    }
  }

  void run_steps(int64_t stop_at) {
    const auto& tc = cfg.train;
    const int64_t last = stop_at >= 0 ? std::min(stop_at, tc.steps) : tc.steps;
    // Tokens one step consumes: across all replicas when they step together, else this node's.
    // (An elastic ring's membership changes them: see adopt.)
    int64_t tokens_per_step = 0;
    double flops_per_token_per_peak = 0;  // MFU per device: the step's tokens were computed by replicas_per_step devices
    auto per_step = [&] {
      tokens_per_step = tc.batch_size * tc.grad_accum * cfg.model.block_size * sync->replicas_per_step();
      flops_per_token_per_peak =
          tc.peak_tflops > 0 ? gpt_train_flops_per_token(cfg.model) / (tc.peak_tflops * 1e12 * sync->replicas_per_step()) : 0;
    };
    per_step();
    // The elastic ring re-formed: the job goes on from the position of the member furthest along.
    auto adopt = [&](const JobPosition& p) {
      step = p.step, tokens = p.tokens, data_position = p.data_position;
      per_step();
    };
    const std::string fail_phase = "replica" + std::to_string(sync->local_rank());  // fault injection (tests)
    Progress progress(tc.steps, tc.log_every);
    double t0 = now_seconds() - time_offset;  // moves later by the time deferred evaluations took
    std::ofstream samples;
    if (writer) samples.open((fs::path(out) / "samples.txt").string(), std::ios::app);
    Tracer::global().name_thread(fmt::format("replica {} (rank {})", sync->local_rank(), sync->rank()));
    // BSP on parameter servers: the servers' rounds reached the job's budget before this node's steps
    // did (a node behind, whose pushes backup workers drop): the run ends here, as at train.steps.
    bool budget_reached = false;
    while (step < last && !budget_reached) {
      TraceSpan step_span("step", "train");
      // The tokens before this step: its evaluation window starts there (an elastic ring's re-formation may
      // change the tokens per step in between).
      const int64_t tokens_before = tokens;
      // dist.elastic: the servers granted this step's samples (each once, whoever joins or leaves);
      // the node's replicas split them as they split a step's block otherwise.
      const int64_t granted = sync->data_grant();
      if (granted >= 0) data_position = granted;
      const int64_t step_data = data_position;  // the step's first sample (logged with dist.elastic)
      const int step_world = sync->world();     // the replicas that take this step's data (an elastic ring's change)
      const double t_step = now_seconds();
      pacer->begin(step);
      const double lr = lr_at(cfg.schedule, cfg.optim.lr, step, tc.steps);
      flat->zero_grad();
      double data_s = 0;  // data_s: time spent assembling batches (the loader's overhead)
      // The step's loss stays on the device until every micro-batch is queued: one host sync per
      // step, not one per micro-batch.
      torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
      for (int64_t micro = 0; micro < tc.grad_accum; ++micro) {
        const double t_data = now_seconds();
        std::optional<TraceSpan> phase(std::in_place, "data", "train");
        auto [x, y] = batch(*train_sampler,
                            granted >= 0 ? WindowSampler::first_sample(data_position, micro, sync->local_rank(),
                                                                       sync->local_size(), tc.batch_size)
                                         : WindowSampler::first_sample(data_position, micro, sync->rank(), sync->world(),
                                                                       tc.batch_size),
                            tc.batch_size);
        data_s += now_seconds() - t_data;
        if (micro == tc.grad_accum - 1) sync->begin_last_backward(lr, step);  // reduce or push during it
        // Dropout masks: a function of (seed, global rank, step, micro-batch) alone, so replicas
        // differ, and a resume draws what the uninterrupted run drew (no generator state to save).
        if (cfg.model.dropout > 0) model->seed_dropout(dropout_seed(tc.seed, sync->rank(), step, micro));
        torch::Tensor l;
        phase.emplace("forward", "train");
        {
          AutocastGuard ac(bf16);
          l = model->loss(x, y) / static_cast<double>(tc.grad_accum);
        }
        phase.emplace("backward", "train");
        // Fault injection (tests): this replica fails in the middle of its backward, after the
        // later layers' gradients are final (their regions already reducing or pushing).
        if (micro == tc.grad_accum - 1 && fail_point("backward", fail_phase.c_str(), step))
          model->parameters().front().register_hook([](const torch::Tensor& g) -> torch::Tensor {
            SYN_FAIL("injected failure in backward (SYNCOPATE_FAIL_AT)", "a test asked for it");
          });
        l.backward();
        loss_sum += l.detach().to(torch::kDouble);
      }
      double loss = loss_sum.item<double>();
      const StepTiming timing = pacer->end_compute();  // the modelled device's compute time has passed
      const double t_wait = now_seconds();
      std::optional<TraceSpan> sync_span(std::in_place, "reduce and update", "train");
      const StepSync synced = sync->finish_step(flat->params, flat->grads, lr, step);  // average, clip, update
      sync_span.reset();
      // Elastic ring: a node was lost mid-step; the ring re-forms and the job goes on: the step redone,
      // or completed elsewhere and taken (a member that completed it; elastic local SGD: the round
      // applied on the re-formed ring). A step taken still gets its end-of-step work below
      // (evaluation, checkpoint, the end of the run); no step of this node's is logged for it.
      bool took_a_step = false;
      if (synced.abandoned) {
        const int64_t was = step;
        adopt(*sync->regroup(flat->params, {step, tokens, data_position}));
        if (step <= was) continue;  // redone
        took_a_step = true;
      }
      bool preempted = false;
      if (!took_a_step) {
        if (synced.skipped) {  // as mixed-precision trainers do on overflow: this step's data is consumed, no update
          ++skipped_steps;
          ++skipped_in_a_row;
          if (writer)
            log::warn("[train] step {}: gradient norm {:.4g} ({}); update skipped ({} in a row)", step + 1, synced.grad_norm,
                      std::isfinite(synced.grad_norm) ? "above train.skip_grad_norm" : "not finite", skipped_in_a_row);
          SYN_CHECK(skipped_in_a_row < tc.max_skipped_steps,
                    fmt::format("{} steps in a row had a non-finite or oversized gradient (last: step {}, norm {:.4g})",
                                skipped_in_a_row, step + 1, synced.grad_norm),
                    "training diverged: lower optim.lr, check the data, or resume from an earlier checkpoint");
        } else {
          skipped_in_a_row = 0;
        }
        // A SIGTERM (preemption notice) on any of the node's replicas stops all of them after this step:
        // agreed in the loss average's collective.
        preempted = stop_requested();
        loss = sync->average(loss, &preempted);
        const double wait_s = now_seconds() - t_wait;  // blocked on communication (and the update)
        // It leaves at once (ps: the servers count it out; the others' next round does not wait for
        // this node's checkpoint write), then writes its checkpoint; no evaluation.
        if (preempted) sync->leave(step + 1);
        ++step;
        if (synced.job_done && !preempted && step < tc.steps) {
          budget_reached = true;
          if (writer)
            log::warn("[train] node {} ends after its step {} of {}: the servers' rounds reached the job's {} steps "
                      "(its own steps were behind them; with ps.backup_workers each push it had left would be dropped "
                      "as late)", cfg.dist.node_rank, step, tc.steps, tc.steps);
        }
        tokens += tokens_per_step;
        data_position = granted >= 0 ? sync->data_grant() : data_position + samples_per_step();
        // Elastic ring: the members agree at every boundary whether the membership changes (a node
        // joins or leaves); if so the ring re-forms here (the step is done on every member). The last
        // boundary too: a member that lost the last step takes it from one that completed it, and a
        // node preempted during it leaves through an agreement its members take part in.
        bool regrouped = false;
        if (!preempted)
          if (const auto p = sync->regroup(flat->params, {step, tokens, data_position})) adopt(*p), regrouped = true;
        // (Not right after a re-formation: it left every member identical, and a joiner, whose first
        // boundary it was, has no check to pair with.)
        if (!regrouped && cfg.dist.check_every > 0 && step % cfg.dist.check_every == 0) sync->check_identical(flat->params, step);

        const double now = now_seconds();
        const double tok_s = tokens_per_step / std::max(now - t_step, 1e-9);
        if (writer) {
          nlohmann::json m = {{"step", step}, {"time_s", now - t0}, {"loss", loss}, {"lr", lr}, {"grad_norm", synced.grad_norm},
                              {"staleness", synced.staleness}, {"wire_bytes", synced.wire_bytes}, {"wire_bytes_received", synced.wire_bytes_received}, {"skipped_steps", skipped_steps},
                              {"tokens", tokens}, {"tokens_per_s", tok_s},
                              {"step_s", now - t_step}, {"data_s", data_s}, {"epoch", train_sampler->epoch(data_position)},
                              {"compute_s", timing.compute_s}, {"modelled_s", timing.modelled_s}, {"wait_s", wait_s},
                              {"overrun", timing.overrun}, {"unix_s", unix_seconds()}};
          if (synced.round >= 0) m["round"] = synced.round, m["outer_norm"] = synced.outer_norm;  // local SGD
          if (cfg.dist.elastic) {  // the step's first sample (ps: as the servers granted it), and who took the step's data
            m["data_position"] = step_data;
            m["world"] = step_world;
          }
          if (flops_per_token_per_peak > 0) m["mfu"] = tok_s * flops_per_token_per_peak;
          if (advice_watch) {  // this node's own step (no communication) against the advice's assumption
            if (auto change = advice_watch->observe(step, (now - t_step) - wait_s)) log::warn("[advice] {}", *change);
            if (advice_watch->ratio() > 0) m["advice_step_ratio"] = advice_watch->ratio();
          }
          metrics->write(m);
        }
        if (verbose) progress.step(step, loss, lr, tok_s);
        // dist.readvise_every: the job decides together whether to ask for a re-advice, or to switch now.
        if (readvise && !preempted && step < tc.steps && step % cfg.dist.readvise_every == 0 &&
            step % cfg.dist.sync_every == 0)
          if (auto next = readvise->decide(step, advice_watch && advice_watch->drifting(), sync->job_sum(),
                                           flat->params.options()))
            switch_to = std::move(*next);
      }

      // eval.every_tokens: the job's tokens as every replica of this node computes them alike (the
      // node's count times the nodes where nodes step apart: exact for the ring and BSP, the
      // expectation for ASP/SSP; the record's global_tokens is the shards' count).
      const int64_t nodes_apart = sync->world() / sync->replicas_per_step();
      const bool at_end = step == tc.steps || budget_reached;  // the run's last step
      const bool eval_due =
          !preempted && (at_end || cfg.eval.due(step, tokens_before * nodes_apart, tokens * nodes_apart));
      const bool switching = !switch_to.empty();  // (every replica of the job agreed on it)
      const bool ckpt_due = due(step, cfg.checkpoint.every, tc.steps) || budget_reached || preempted || switching;
      const bool sample_due = !preempted && cfg.eval.sample_tokens > 0 && due(step, cfg.eval.sample_every, tc.steps);
      if (eval_due || ckpt_due || sample_due || step == last) sync->synchronize(flat->params);
      if (!writer) {  // evaluation, samples, checkpoints: local replica 0 (the others hold the same weights)
        if (preempted || switching) return;  // (every replica of the node agreed on it)
        continue;
      }
      if (eval_due) {
        TraceSpan span("evaluate", "train");
        const double t_eval = now_seconds();
        // Scores (or, eval.defer, snapshots) `weights` into a record stamped t_weights, off this node's clock.
        auto record_evaluation = [&](const at::Tensor& weights, nlohmann::json m, double t_weights) {
          describe_held_out(m);
          last_eval_global_tokens = m.at("global_tokens").get<int64_t>();
          if (cfg.eval.defer) {
            keep_snapshot(weights, m);
            // The snapshot's cost is off this node's clock.
            snapshots.back().record["eval_s"] = now_seconds() - t_weights;
            snapshots.back().record["deferred"] = true;
            t0 += now_seconds() - t_weights;
          } else {
            const double vl = evaluate_weights(weights);
            m["val_loss"] = vl;
            m["eval_s"] = now_seconds() - t_weights;
            metrics->write(m);
            if (verbose)
              progress.line(fmt::format("[eval] step {}: train loss {:.4f}, val loss {:.4f} ({} weights)", step, loss, vl,
                                        m.at("eval_of").get<std::string>()));
          }
        };
        // The weights the job would ship; at the end of a complete run node 0 takes the job's final
        // ones (parameter servers: once every node has finished, pulled from the shards). While it
        // waits for the others, the evaluation points the shards' count of the job's tokens passes
        // are taken from the servers too (eval.every_tokens), so the curve has no gap where node 0
        // stopped stepping before a straggler.
        const bool job_final = at_end && cfg.dist.node_rank == 0;
        auto while_waiting = [&](int64_t job_tokens, const std::function<at::Tensor()>& pull) {
          if (cfg.eval.every_tokens <= 0 || !cfg.eval.due(step, last_eval_global_tokens, job_tokens)) return;
          const double t_pull = now_seconds();
          const at::Tensor w = pull();
          nlohmann::json m = {{"step", step}, {"time_s", t_pull - t0}, {"tokens", tokens}, {"eval_of", "servers"},
                              {"global_tokens", job_tokens}, {"unix_s", unix_seconds()}, {"while_waiting", true}};
          record_evaluation(w, m, t_pull);
        };
        const ShippedWeights w =
            job_final ? sync->final_weights(flat->params, tokens_per_step, while_waiting) : sync->shipped(flat->params);
        // A job's final weights are stamped when they exist: after node 0 waited for the others'
        // last updates (that wait is the job's time, not evaluation time).
        const double t_weights = job_final ? now_seconds() : t_eval;
        nlohmann::json m = {{"step", step}, {"time_s", t_weights - t0}, {"tokens", tokens}, {"eval_of", w.of},
                            {"global_tokens", sync->job_tokens(tokens, tokens_per_step)}, {"unix_s", unix_seconds()}};
        if (job_final) m["job_final"] = true;
        if (!w.complete) m["job_final_partial"] = true;
        record_evaluation(w.weights, m, t_weights);
      }
      if (sample_due) {
        TraceSpan span("sample", "train");
        const std::string s = sample_text();
        samples << "--- step " << step << " ---\n" << s << "\n";
        samples.flush();
        if (verbose) progress.line(fmt::format("[sample] step {}:\n{}\n", step, s));
      }
      // Scored before a checkpoint, so that a resume from it loses none; but not at the run's last
      // step, whose snapshots are scored after finish(): node 0's wait for the others' FINISH is the
      // job's time, and their scoring must not lengthen it (a crash while scoring them loses them,
      // with nothing left to resume).
      if (ckpt_due && !snapshots.empty() && !at_end) {
        const double t_score = now_seconds();
        score_snapshots(progress);
        t0 += now_seconds() - t_score;
        // Off time_s; a study that reads the hosts' clock (unix_s: a restart's gap counts) takes it off too.
        metrics->write({{"step", step}, {"scored_snapshots_s", now_seconds() - t_score}, {"unix_s", unix_seconds()}});
      }
      if (ckpt_due) {
        TraceSpan span("checkpoint", "train");
        const std::string root = (fs::path(out) / "checkpoints").string();
        // checkpoint.background: a detached snapshot is written while training goes on; the run's
        // last checkpoint (its end, a SIGTERM, a switch) is written here, since the process ends (or
        // restarts from it) right after, once the one in flight has committed: a restarting ring
        // resumes from a step every node holds, and the others completed that write (a preempted
        // node that abandoned it left the job none in common: every node restarted from step 0).
        const bool last_write = at_end || preempted || switching;
        if (background_writer && !last_write) {
          const double waited = background_writer->wait();  // one snapshot in memory at a time
          background_writer->submit(
              snapshot_checkpoint(step, *model, sync->optimizer(), meta(now_seconds() - t0), sync->state(), /*detach=*/true));
          metrics->write({{"step", step}, {"checkpoint_wait_s", waited}, {"unix_s", unix_seconds()}});
          if (verbose)
            progress.line(fmt::format("[checkpoint] step {} written in the background{}", step,
                                      waited >= 1e-3 ? fmt::format(" (waited {:.3f} s for the previous write)", waited) : ""));
        } else {
          if (background_writer) {
            try {
              background_writer->wait();
            } catch (const Error& e) {  // an earlier write failed: this one is still attempted
              log::error("[checkpoint] {}", e.what());
            }
          }
          // emulate.checkpoint_s: the target's write time, on this node's clock (the job's time),
          // held before the checkpoint commits.
          const double t_write = now_seconds();
          const std::string dir = write_checkpoint(
              root, snapshot_checkpoint(step, *model, sync->optimizer(), meta(now_seconds() - t0), sync->state(), /*detach=*/false),
              cfg.checkpoint.keep, [&] { hold_checkpoint_write(t_write, cfg.emulate.checkpoint_s); });
          if (verbose) progress.line(fmt::format("[checkpoint] {}", dir));
        }
      }
      if (switching) {  // the launcher restarts this node with --resume in the advice's pick
        write_file_atomic((fs::path(out) / kNextAdviceFile).string(), switch_to);
        log::warn("[advice] node {} stopped after step {} to switch to {} and wrote its checkpoint; its launcher "
                  "restarts it with --resume --dist.advice={} (exit {})", cfg.dist.node_rank, step,
                  Readvise::pick_of(switch_to), (fs::path(out) / kNextAdviceFile).string(), kExitSwitch);
        return;
      }
      if (preempted) {
        if (writer)
          log::warn("[train] SIGTERM: node {} stopped after step {} and wrote its checkpoint; {}", cfg.dist.node_rank, step,
                    cfg.dist.elastic && cfg.dist.mode == "ring" && cfg.dist.sync_every > 1
                        ? (step % cfg.dist.sync_every == 0
                               ? "it left the ring at a round boundary (the others re-formed without it at once); "
                                 "--resume joins it again with a member's state"
                               : "it left the ring in the middle of a round (its partial round is dropped; the others "
                                 "re-form without it at the round's end); --resume joins it again with a member's state")
                    : cfg.dist.elastic && cfg.dist.mode == "ring"
                        ? "it left the ring (the others re-formed without it at once); --resume joins it again with a "
                          "member's state"
                    : cfg.dist.elastic && cfg.dist.sync_every > 1 && step % cfg.dist.sync_every != 0
                        ? "it left the job in the middle of a round (the servers counted it out at once; its partial "
                          "round was never pushed and is dropped); --resume joins it again at the job's next round"
                    : cfg.dist.elastic ? "it left the job (the servers counted it out at once); --resume joins it again at "
                                       "the job's clock"
                    : cfg.dist.mode == "ps"
                        ? "it left the job (the servers counted it out at once); --resume brings it back at this step, "
                          "behind the job (--dist.elastic=true joins at the job's clock)"
                        : "the other nodes stop when they miss it; resume the job from its newest common checkpoint");
        return;  // (its snapshots, eval.defer, are not scored: a preempted node has no time to spare)
      }
    }
    if (verbose) progress.finish();
    if (background_writer) background_writer->wait();  // (run(stop_at) stops with one in flight)
    if (step >= tc.steps || budget_reached) sync->finish(step);  // the run is complete: the peers are told
    if (writer && !snapshots.empty()) score_snapshots(progress);  // eval.defer: after training, on no node's clock
    if (writer) report_sync_counters();
  }

  // The synchronization's totals: logged, and kept in sync.json for scripts and tests.
  void report_sync_counters() {
    const SyncCounters c = sync->counters();
    const nlohmann::json j = {{"mode", cfg.dist.mode}, {"regions", c.regions}, {"launched_early", c.launched_early},
                              {"reduced", c.reduced}, {"wire_bytes", c.wire_bytes}, {"wire_bytes_received", c.wire_bytes_received}};
    write_file_atomic((fs::path(out) / "sync.json").string(), j.dump() + "\n");
    if (c.reduced > 0)
      log::info("[{}] {} of {} {} during backward", cfg.dist.mode == "ps" ? "ps" : "dist", c.launched_early, c.reduced,
                cfg.dist.mode == "ps" ? "shard pushes left" : "bucket reductions started");
  }
};

JobMembership::JobMembership() = default;
JobMembership::JobMembership(JobMembership&&) noexcept = default;
JobMembership::~JobMembership() = default;
void JobMembership::abort_failed_replica(int local) {
  std::string why = "unknown error";
  try {
    throw;
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
  }
  abort(fmt::format("local replica {} failed: {}", local, why));
}

void JobMembership::abort(const std::string& why) {
  // The ring first: nothing a local collective left half-done can leave the node once its
  // communicators are aborted; replicas blocked on a lane fail at once; the other nodes see this
  // node leave.
  if (ring) ring->shutdown();
  if (group) group->abort(why);
}

JobMembership join_job(RunConfig& cfg, const std::string& out_dir, bool resume, int local, bool verbose) {
  cfg.validate();
  JobMembership job;
  if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
  apply_determinism(cfg.train.deterministic);  // before any model or cuBLAS handle exists
  const bool cuda = torch::cuda::is_available();
  SYN_CHECK(cfg.train.device != "cuda" || cuda, "train.device=cuda but no CUDA device is visible",
            "use train.device=auto or cpu, or check CUDA_VISIBLE_DEVICES and the driver");
  resolve_from_environment(cfg.dist);  // the launch layout decides the devices
  if (local <= 0) local = static_cast<int>(cfg.dist.local_replicas);
  if (cfg.train.device == "cuda" || (cfg.train.device == "auto" && cuda)) {
    const int visible = static_cast<int>(torch::cuda::device_count());
    if (cfg.dist.device >= 0) {  // launch=gpu: this process is a node with one replica on its local rank's GPU
      SYN_CHECK(cfg.dist.device < visible,
                fmt::format("dist.launch=gpu: this process's GPU is {} (its local rank) but {} GPU(s) are visible",
                            cfg.dist.device, visible),
                "start at most one process per visible GPU, and leave CUDA_VISIBLE_DEVICES listing all of the "
                "host's GPUs (each process picks its own)");
      job.devices.push_back(static_cast<int>(cfg.dist.device));
      local = 1;
    } else {
      if (local <= 0) local = visible;
      SYN_CHECK(local <= visible, fmt::format("dist.local_replicas={} but only {} GPU(s) are visible", local, visible),
                "lower dist.local_replicas, or 0 for one replica per visible GPU");
      for (int d = 0; d < local; ++d) job.devices.push_back(d);
    }
  }
  if (local <= 0) local = 1;
  job.local_size = local;
  if (local > 1) job.group = make_local_group(local, job.devices, cfg.dist.local_timeout_s);

  fs::create_directories(out_dir);
  // Checkpoint steps this node could resume from; with none, the rendezvous tells every node.
  const std::string ckroot = (fs::path(out_dir) / "checkpoints").string();
  if (const int n = remove_checkpoint_leftovers(ckroot); n > 0)
    log::info("[checkpoint] removed {} unfinished checkpoint write(s) from {}", n, ckroot);
  if (resume) job.checkpoints = list_checkpoints(ckroot);
  job.token = cfg.dist.mode == "none" ? job_token_from_environment() : job_token_or_insecure_default("[dist]");
  job.tokenizer = make_tokenizer(cfg.data.tokenizer_config());
  SYN_CHECK(job.tokenizer->vocab_size() <= cfg.model.vocab_size,
            fmt::format("the {} tokenizer has {} ids but model.vocab_size is {}", job.tokenizer->name(),
                        job.tokenizer->vocab_size(), cfg.model.vocab_size),
            fmt::format("set --model.vocab_size={} (or larger)", job.tokenizer->vocab_size()));
  job.data = std::make_shared<TrainingData>(
      open_training_data(cfg.data, *job.tokenizer, cfg.model.block_size, verbose && cfg.dist.node_rank == 0));
  const std::string where = job.devices.empty() ? "cpu" : "cuda, " + std::string(job.group ? job.group->backend() : "one GPU");
  if (cfg.dist.mode != "none" && cfg.dist.node_rank == 0)
    log::info("[dist] node {}/{}: {} local replica(s) ({}); launch layout: one process per {}; {} ...",
              cfg.dist.node_rank, cfg.dist.nnodes, local, where,
              cfg.dist.launch == "gpu" ? "GPU (each process a node of the job, its GPU its local rank's)" : "node",
              cfg.dist.mode == "ps" ? fmt::format("parameter servers {}", cfg.dist.servers)
                                    : fmt::format("rendezvous at {}:{}", cfg.dist.master_addr, cfg.dist.master_port));
  else if (cfg.dist.mode == "none" && local > 1)
    log::info("[dist] one node: {} local replicas ({})", local, where);
  if (const std::string w = launch_layout_warning(cfg.dist); !w.empty() && cfg.dist.device == 0)
    log::warn("[dist] {}", w);  // (once per host: the process of the host's first GPU)
  // Nodes must agree on model and config, and resume from the newest checkpoint all of them hold:
  // the rendezvous carries each node's list, the job decides (agreed_resume_step).
  if (cfg.dist.mode == "ring" && cfg.dist.elastic) {
    // The elastic ring: a session with the rendezvous service (the ring forms in the first
    // regroup); this node's newest checkpoint, the members take the newest any of them holds.
    SYN_CHECK(local == 1, fmt::format("dist.elastic with dist.mode=ring and {} local replicas", local),
              "the elastic ring takes one replica per node: set --dist.local_replicas=1, or start one process per GPU "
              "(--dist.launch=gpu)");
    RendezvousSessionOptions so;
    std::tie(so.addr, so.port) = rendezvous_service_address(cfg.dist);
    so.token = job.token;
    so.timeout_s = cfg.dist.timeout_s;
    so.hello.node = static_cast<int>(cfg.dist.node_rank);
    so.hello.fingerprint = cfg.fingerprint();
    so.hello.nnodes = static_cast<int>(cfg.dist.nnodes);
    so.hello.min_nodes = static_cast<int>(cfg.dist.min_nodes);
    // Local SGD's members reach a round's end up to a round's drift apart, which the round's own sum
    // tolerates (dist.timeout_s): a re-formation waits as long for them, or a slower member's
    // completed round would be dropped and the early ones would go on without it.
    so.hello.reform_wait_s =
        cfg.dist.sync_every > 1 ? std::max(cfg.dist.reform_wait_s, cfg.dist.timeout_s) : cfg.dist.reform_wait_s;
    so.hello.start_wait_s = cfg.dist.timeout_s;
    so.hello.streams = static_cast<int>(cfg.dist.streams);
    so.heartbeat_s = std::min(1.0, cfg.dist.reform_wait_s / 4);  // the service ends a session silent for reform_wait_s
    job.session = std::make_shared<RendezvousSession>(so);
    job.resume_step = job.checkpoints.empty() ? -1 : job.checkpoints.back();
  } else if (cfg.dist.mode == "ring" && cfg.dist.nnodes > 1) {
    RendezvousOptions o = rendezvous_options(cfg.dist, job.token, cfg.fingerprint());
    o.blob = encode_checkpoint_steps(job.checkpoints);
    o.lanes = ring_lanes(parse_hierarchy(cfg.dist.hierarchy), local);
    o.latency_s = cfg.emulate.latency_ms / 1e3;
    if (o.latency_s > 0 && cfg.dist.device == 0)
      log::info("[dist] emulated link latency: every ring message this node receives is held {} ms", cfg.emulate.latency_ms);
    job.ring = std::make_shared<Ring>(connect_ring(o));
    std::vector<std::vector<int64_t>> held;
    for (size_t r = 0; r < job.ring->blobs.size(); ++r)
      held.push_back(decode_checkpoint_steps(job.ring->blobs[r], static_cast<int>(r)));
    job.resume_step = agreed_resume_step(held);
  } else {  // no peers to agree with: the newest local checkpoint
    job.resume_step = job.checkpoints.empty() ? -1 : job.checkpoints.back();
  }
  return job;
}

Trainer::Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
                 bool verbose) {
  RunConfig c = cfg;
  own_job_ = std::make_unique<JobMembership>(join_job(c, out_dir, resume, 1, verbose));
  impl_ = std::make_unique<Impl>(c, out_dir, resume, config_toml, *own_job_, 0, verbose);
}
Trainer::Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
                 JobMembership& job, int local, bool verbose)
    : impl_(std::make_unique<Impl>(cfg, out_dir, resume, config_toml, job, local, verbose)) {}
Trainer::~Trainer() = default;
void Trainer::run(int64_t stop_at) { impl_->run(stop_at); }
double Trainer::evaluate() { return impl_->evaluate(); }
std::string Trainer::sample_text() { return impl_->sample_text(); }
int64_t Trainer::step() const { return impl_->step; }
bool Trainer::switching() const { return !impl_->switch_to.empty(); }
SyncCounters Trainer::sync_counters() const { return impl_->sync->counters(); }
GPTImpl& Trainer::model() { return *impl_->model; }
FlatParameters& Trainer::flat() { return *impl_->flat; }

}  // namespace syncopate
