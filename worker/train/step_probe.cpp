#include "worker/train/step_probe.h"

#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "common/check.h"
#include "common/comm/cuda_device.h"
#include "model/gpt.h"
#include "worker/train/determinism.h"
#include "worker/train/autocast.h"
#include "worker/train/precision.h"
#include "worker/train/step_pacer.h"

namespace syncopate {
namespace {

long long mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return -1;
}

}  // namespace

StepProbeResult probe_steps(const RunConfig& cfg, int64_t node, int device, int steps, int warmup) {
  SYN_CHECK(steps >= 1, "the step probe needs at least one timed step", "raise --probe.steps");
  StepProbeResult r;
  torch::Device dev(torch::kCPU);
  if (device >= 0) {
    SYN_CHECK(torch::cuda::is_available(), fmt::format("the probe was asked for CUDA device {} but CUDA is not available", device),
              "probe on CPU (no GPU visible), or check CUDA_VISIBLE_DEVICES and the driver");
    dev = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device));
    r.device = fmt::format("cuda:{}", device);
  }
  SYN_CHECK(cfg.train.precision != "bf16" || dev.is_cuda(), "train.precision=bf16 needs a CUDA device",
            "use precision auto or fp32 on CPU");
  r.bf16 = choose_precision(cfg.train.precision, dev.is_cuda(), dev.is_cuda() ? cuda_compute_capability(device) : -1).bf16;
  if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
  apply_determinism(cfg.train.deterministic);  // the job's kernels, timed as the job will run them
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  GPT model(cfg.model);
  model->to(dev);
  model->train();
  for (const auto& p : model->parameters()) r.params += p.numel();
  const int64_t B = cfg.train.batch_size, T = cfg.model.block_size;
  r.tokens_per_step = B * T * cfg.train.grad_accum;
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(dev);
  const torch::Tensor x = torch::randint(cfg.model.vocab_size, {B, T}, opts);
  const torch::Tensor y = torch::randint(cfg.model.vocab_size, {B, T}, opts);
  StepPacer pacer(cfg.emulate, static_cast<uint64_t>(cfg.train.seed), node);
  for (int s = 0; s < warmup + steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    pacer.begin(s);
    for (int64_t m = 0; m < cfg.train.grad_accum; ++m) {
      torch::Tensor loss;
      {
        AutocastGuard autocast(r.bf16);  // the forward under autocast, as the trainer runs it
        loss = model->loss(x, y) / static_cast<double>(cfg.train.grad_accum);
      }
      loss.backward();
    }
    if (dev.is_cuda()) torch::cuda::synchronize(device);
    const StepTiming t = pacer.end_compute();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (auto& p : model->parameters())  // kept and zeroed, as the trainer's flat gradient buffer is
      if (p.grad().defined()) p.grad().zero_();
    if (s < warmup) continue;
    r.step_s.push_back(wall);
    r.compute_s.push_back(t.compute_s);
    r.overruns += t.overrun ? 1 : 0;
  }
  if (dev.is_cuda()) cuda_memory(device, r.device_free_bytes, r.device_total_bytes);
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) == 0) r.rss_peak_bytes = static_cast<long long>(ru.ru_maxrss) * 1024;
  r.host_available_bytes = mem_available_bytes();
  return r;
}

}  // namespace syncopate
