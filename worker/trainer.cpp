#include "worker/trainer.h"

#include <chrono>
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
#include "common/job_token.h"
#include "common/flat_adamw.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "worker/autocast.h"
#include "worker/checkpoint.h"
#include "worker/flat_parameters.h"
#include "worker/metrics_log.h"
#include "worker/parameter_update.h"
#include "worker/ps_client.h"
#include "worker/replicas.h"
#include "worker/step_pacer.h"
#include "worker/local_group.h"
#include "worker/data_config.h"
#include "worker/window_sampler.h"

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
  std::unique_ptr<FlatAdamW> opt;
  std::shared_ptr<Replicas> replicas;  // this replica's view of the job (shared with JobMembership, for abort)
  std::unique_ptr<ParameterUpdate> update;
  std::shared_ptr<Tokenizer> tokenizer;  // the node's, shared by its local replicas (read-only)
  std::shared_ptr<TrainingData> data;
  std::unique_ptr<WindowSampler> train_sampler, val_sampler;
  int64_t data_position = 0;  // training samples consumed by this worker's steps so far (see WindowSampler)
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<StepPacer> pacer;  // modelled compute time per step (emulate.*); measures only when off
  int64_t step = 0;
  int64_t tokens = 0;
  double time_offset = 0;  // training seconds before a resume
  std::string config_toml;

  Impl(const RunConfig& c, const std::string& out_dir, bool resume, const std::string& toml, JobMembership& job,
       int local, bool verb)
      : cfg(c), out(out_dir), verbose(verb), config_toml(toml) {
    cfg.validate();
    const int dev = job.devices.empty() ? -1 : job.devices.at(static_cast<size_t>(local));
    if (dev >= 0) device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dev));
    SYN_CHECK(cfg.train.precision != "bf16" || device.is_cuda(), "train.precision=bf16 needs a CUDA device",
              "use precision auto or fp32 on CPU");
    bf16 = device.is_cuda() && cfg.train.precision != "fp32";
    replicas = job.replicas.at(static_cast<size_t>(local));
    writer = replicas->local_rank() == 0;
    verbose = verbose && replicas->rank() == 0;  // rank 0 prints, local replica 0 of every node writes outputs

    tokenizer = job.tokenizer;
    data = job.data;
    train_sampler = std::make_unique<WindowSampler>(data->train, cfg.model.block_size, cfg.train.seed, cfg.model.vocab_size);
    val_sampler = std::make_unique<WindowSampler>(data->val, cfg.model.block_size, cfg.train.seed + 1, cfg.model.vocab_size);

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
    opt = std::make_unique<FlatAdamW>(cfg.optim, flat->numel(), flat->decay_ranges(), flat->params.options());

    const std::string ckroot = (fs::path(out) / "checkpoints").string();
    SYN_CHECK(!resume || replicas->resume_step() >= 0, fmt::format("--resume given but '{}' holds no checkpoint", ckroot),
              "run without --resume to start fresh, or point --out at the run to resume");
    if (replicas->resume_step() >= 0) {
      const std::string dir = checkpoint_dir(ckroot, replicas->resume_step());
      auto meta = load_checkpoint(dir, *model, *opt);
      step = meta.at("step").get<int64_t>();
      tokens = meta.at("tokens").get<int64_t>();
      time_offset = meta.value("time_s", 0.0);
      data_position = meta.at("data").value("position", int64_t{-1});  // -1: older checkpoint, derived below
      const int64_t newest = job.checkpoints.empty() ? step : job.checkpoints.back();
      if (verbose)
        std::cout << fmt::format("[train] resumed from {} (step {}{})\n", dir, step,
                                 step < newest ? fmt::format("; the newest checkpoint every node holds, "
                                                             "local step {} ignored", newest)
                                               : "");
    }
    if (data_position < 0) data_position = step * samples_per_step();

    replicas->broadcast_from_rank0(flat->params);  // every replica starts from replica 0's weights
    std::vector<std::pair<int64_t, int64_t>> ranges;  // where each parameter lives in the flat buffers
    for (const auto& seg : flat->segments) ranges.emplace_back(seg.offset, seg.numel);
    replicas->attach(model->parameters(), ranges, flat->grads);
    if (cfg.dist.mode == "ps") {  // the servers hold the optimizer; INIT gives every worker the same start
      // Local replica 0 talks to the servers for its node and shares the result with the others.
      const auto endpoints = PsClient::parse_endpoints(cfg.dist.servers);
      std::unique_ptr<PsClient> client;
      if (writer) {
        client = std::make_unique<PsClient>(endpoints, job.token, static_cast<int>(cfg.dist.node_rank),
                                            static_cast<int>(cfg.dist.nnodes), cfg.dist.timeout_s, cfg.dist.curve_server_key);
        at::Tensor start = flat->params.to(at::kCPU);  // the client reads and writes host memory
        client->init(start, flat->decay_ranges(), cfg.optim, step);
        flat->params.copy_(start);
      }
      update = make_node_shared_update(make_ps_update(std::move(client), cfg.dist.ps_overlap, cfg.dist.ps_push_in_backward,
                                                      *replicas, static_cast<int>(endpoints.size())),
                                       *replicas);
      replicas->broadcast_from_rank0(flat->params);  // the servers' start, on every local replica
    } else {
      update = make_local_update(*opt);
    }
    update->attach(model->parameters(), ranges, flat->grads);
    pacer = std::make_unique<StepPacer>(cfg.emulate, static_cast<uint64_t>(cfg.train.seed), cfg.dist.node_rank);
    if (writer) {
      write_file_atomic((fs::path(out) / "config.toml").string(), config_toml);
      metrics = std::make_unique<MetricsLog>((fs::path(out) / "metrics.jsonl").string(), resume ? step : -1);
    }
  }

  // Samples one optimizer step takes from the data order: every replica's micro-batches (see WindowSampler).
  int64_t samples_per_step() const { return cfg.train.batch_size * cfg.train.grad_accum * replicas->world(); }
  bool writer = true;  // local replica 0: writes metrics, samples and checkpoints for its node

  std::pair<torch::Tensor, torch::Tensor> batch(const WindowSampler& sampler, int64_t first, int64_t b) {
    const int64_t T = cfg.model.block_size;
    auto x = torch::empty({b, T}, torch::kLong), y = torch::empty({b, T}, torch::kLong);
    sampler.fill(first, b, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    return {x.to(device, /*non_blocking=*/true), y.to(device, true)};
  }

  double evaluate() {
    torch::NoGradGuard no_grad;
    model->eval();
    double sum = 0;
    for (int64_t i = 0; i < cfg.eval.batches; ++i) {
      auto [x, y] = batch(*val_sampler, i * cfg.train.batch_size, cfg.train.batch_size);
      AutocastGuard ac(bf16);
      sum += model->loss(x, y).item<double>();
    }
    model->train();
    return sum / cfg.eval.batches;
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
    const auto& tc = cfg.train;
    const int64_t last = stop_at >= 0 ? std::min(stop_at, tc.steps) : tc.steps;
    // Tokens one step consumes: across all replicas when they step together, else this node's.
    const int64_t tokens_per_step = tc.batch_size * tc.grad_accum * cfg.model.block_size * replicas->replicas_per_step();
    Progress progress(tc.steps, tc.log_every);
    const double t0 = now_seconds() - time_offset;
    std::ofstream samples;
    if (writer) samples.open((fs::path(out) / "samples.txt").string(), std::ios::app);
    while (step < last) {
      const double t_step = now_seconds();
      pacer->begin(step);
      const double lr = lr_at(cfg.schedule, cfg.optim.lr, step, tc.steps);
      flat->zero_grad();
      double loss = 0, data_s = 0;  // data_s: time spent assembling batches (the loader's overhead)
      for (int64_t micro = 0; micro < tc.grad_accum; ++micro) {
        const double t_data = now_seconds();
        auto [x, y] = batch(*train_sampler,
                            WindowSampler::first_sample(data_position, micro, replicas->rank(), replicas->world(), tc.batch_size),
                            tc.batch_size);
        data_s += now_seconds() - t_data;
        if (micro == tc.grad_accum - 1) {  // reduce (ring) or push (ps) during the last backward only
          replicas->arm_overlap();
          update->arm(lr, step);
        }
        torch::Tensor l;
        {
          AutocastGuard ac(bf16);
          l = model->loss(x, y) / static_cast<double>(tc.grad_accum);
        }
        l.backward();
        loss += l.item<double>();
      }
      const StepTiming timing = pacer->end_compute();  // the modelled device's compute time has passed
      const double t_wait = now_seconds();
      replicas->average_gradients(flat->grads);
      loss = replicas->average(loss);
      const double gnorm = clip_grad_norm(flat->grads, cfg.optim.grad_clip);
      const double staleness = update->apply(flat->params, flat->grads, lr, step);
      const double wait_s = now_seconds() - t_wait;  // blocked on communication (and the update)
      ++step;
      tokens += tokens_per_step;
      data_position += samples_per_step();
      if (cfg.dist.check_every > 0 && step % cfg.dist.check_every == 0) replicas->check_identical(flat->params, step);

      const double now = now_seconds();
      const double tok_s = tokens_per_step / std::max(now - t_step, 1e-9);
      if (writer) metrics->write({{"step", step}, {"time_s", now - t0}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm}, {"staleness", staleness},
                      {"tokens", tokens}, {"tokens_per_s", tok_s},
                      {"step_s", now - t_step}, {"data_s", data_s}, {"epoch", train_sampler->epoch(data_position)},
                      {"compute_s", timing.compute_s}, {"modelled_s", timing.modelled_s}, {"wait_s", wait_s},
                      {"overrun", timing.overrun}, {"unix_s", unix_seconds()}});
      if (verbose) progress.step(step, loss, lr, tok_s);

      const bool eval_due = due(step, cfg.eval.every, tc.steps), ckpt_due = due(step, cfg.checkpoint.every, tc.steps);
      const bool sample_due = cfg.eval.sample_tokens > 0 && due(step, cfg.eval.sample_every, tc.steps);
      if (eval_due || ckpt_due || sample_due || step == last) update->synchronize(flat->params);
      if (!writer) continue;  // evaluation, samples, checkpoints: local replica 0 (the others hold the same weights)
      if (eval_due) {
        const double t_eval = now_seconds();
        const double vl = evaluate();
        metrics->write({{"step", step}, {"time_s", now_seconds() - t0}, {"val_loss", vl}, {"tokens", tokens},
                        {"eval_s", now_seconds() - t_eval}, {"unix_s", unix_seconds()}});
        if (verbose) progress.line(fmt::format("[eval] step {}: train loss {:.4f}, val loss {:.4f}", step, loss, vl));
      }
      if (sample_due) {
        const std::string s = sample_text();
        samples << "--- step " << step << " ---\n" << s << "\n";
        samples.flush();
        if (verbose) progress.line(fmt::format("[sample] step {}:\n{}\n", step, s));
      }
      if (ckpt_due) {
        const std::string dir = save_checkpoint((fs::path(out) / "checkpoints").string(), step, *model, *opt,
                                                meta(now_seconds() - t0), cfg.checkpoint.keep);
        if (verbose) progress.line(fmt::format("[checkpoint] {}", dir));
      }
    }
    if (verbose) progress.finish();
  }
};

JobMembership::JobMembership() = default;
JobMembership::JobMembership(JobMembership&&) noexcept = default;
JobMembership::~JobMembership() = default;
void JobMembership::abort(const std::string& why) {
  for (auto& r : replicas) r->abort(why);
}

JobMembership join_job(RunConfig& cfg, const std::string& out_dir, bool resume, int local, bool verbose) {
  cfg.validate();
  JobMembership job;
  if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
  const bool cuda = torch::cuda::is_available();
  SYN_CHECK(cfg.train.device != "cuda" || cuda, "train.device=cuda but no CUDA device is visible",
            "use train.device=auto or cpu, or check CUDA_VISIBLE_DEVICES and the driver");
  if (local <= 0) local = static_cast<int>(cfg.dist.local_replicas);
  if (cfg.train.device == "cuda" || (cfg.train.device == "auto" && cuda)) {
    const int visible = static_cast<int>(torch::cuda::device_count());
    if (local <= 0) local = visible;
    SYN_CHECK(local <= visible, fmt::format("dist.local_replicas={} but only {} GPU(s) are visible", local, visible),
              "lower dist.local_replicas, or 0 for one replica per visible GPU");
    for (int d = 0; d < local; ++d) job.devices.push_back(d);
  }
  if (local <= 0) local = 1;
  if (local > 1) job.group = make_local_group(local, job.devices);

  fs::create_directories(out_dir);
  // Checkpoint steps this node could resume from; with none, the rendezvous tells every node.
  if (resume) job.checkpoints = list_checkpoints((fs::path(out_dir) / "checkpoints").string());
  resolve_from_environment(cfg.dist);
  job.token = job_token_from_environment();
  if (job.token.empty() && cfg.dist.mode != "none") {
    job.token = "syncopate-insecure-default";
    std::cerr << "[dist] warning: SYNCOPATE_TOKEN is not set; any local process can join this job\n";
  }
  job.tokenizer = make_tokenizer(cfg.data.tokenizer_config());
  SYN_CHECK(job.tokenizer->vocab_size() <= cfg.model.vocab_size,
            fmt::format("the {} tokenizer has {} ids but model.vocab_size is {}", job.tokenizer->name(),
                        job.tokenizer->vocab_size(), cfg.model.vocab_size),
            fmt::format("set --model.vocab_size={} (or larger)", job.tokenizer->vocab_size()));
  job.data = std::make_shared<TrainingData>(
      open_training_data(cfg.data, *job.tokenizer, cfg.model.block_size, verbose && cfg.dist.node_rank == 0));
  const std::string where = job.devices.empty() ? "cpu" : "cuda, " + std::string(job.group ? job.group->backend() : "one GPU");
  if (cfg.dist.mode != "none" && cfg.dist.node_rank == 0)
    std::cout << fmt::format("[dist] node {}/{}: {} local replica(s) ({}); rendezvous at {}:{} ...\n", cfg.dist.node_rank,
                             cfg.dist.nnodes, local, where, cfg.dist.master_addr, cfg.dist.master_port);
  else if (cfg.dist.mode == "none" && local > 1)
    std::cout << fmt::format("[dist] one node: {} local replicas ({})\n", local, where);
  // Nodes must agree on model and config, and resume from the newest checkpoint all of them hold.
  job.replicas = make_replicas(cfg.dist, job.token, cfg.fingerprint(), job.checkpoints, job.group, job.devices);
  return job;
}

Trainer::Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
                 bool verbose) {
  RunConfig c = cfg;
  JobMembership job = join_job(c, out_dir, resume, 1, verbose);
  impl_ = std::make_unique<Impl>(c, out_dir, resume, config_toml, job, 0, verbose);
}
Trainer::Trainer(const RunConfig& cfg, const std::string& out_dir, bool resume, const std::string& config_toml,
                 JobMembership& job, int local, bool verbose)
    : impl_(std::make_unique<Impl>(cfg, out_dir, resume, config_toml, job, local, verbose)) {}
Trainer::~Trainer() = default;
void Trainer::run(int64_t stop_at) { impl_->run(stop_at); }
double Trainer::evaluate() { return impl_->evaluate(); }
std::string Trainer::sample_text() { return impl_->sample_text(); }
int64_t Trainer::step() const { return impl_->step; }
GPTImpl& Trainer::model() { return *impl_->model; }
FlatParameters& Trainer::flat() { return *impl_->flat; }

}  // namespace syncopate
