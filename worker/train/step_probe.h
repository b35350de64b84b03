// What one optimizer step of the job's model costs on this node (syncopate-probe): real steps of the
// configured model, batch, accumulation and precision on random tokens (the speed of a step does not
// depend on what it learns; nothing is updated: the optimizer's update, clipping and batch assembly
// are not in the time, so on real hardware it is a lower bound of the step), paced by emulate.*
// exactly as training paces them, so that a probe of an emulated cluster measures the emulated step
// (its slowdown, and its jitter: the same draws as training's steps warmup..warmup+steps-1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "worker/train/run_config.h"

namespace syncopate {

struct StepProbeResult {
  std::vector<double> step_s;     // each timed step as training would see it: compute, then the pacer's sleep
  std::vector<double> compute_s;  // its real forward and backward, seconds
  int64_t overruns = 0;           // steps whose real compute exceeded the modelled time (emulation did not hold)
  int64_t params = 0;             // the model's parameters (the flat buffer a step synchronizes)
  int64_t tokens_per_step = 0;    // batch_size x grad_accum x block_size, one replica
  std::string device = "cpu";     // "cpu" or "cuda:N"
  bool bf16 = false;              // bf16 autocast (train.precision and the device decide)
  long long device_free_bytes = -1, device_total_bytes = -1;  // CUDA after the steps (the allocator's cache in use); -1 on CPU
  long long rss_peak_bytes = 0;   // this process's peak resident memory after the steps
  long long host_available_bytes = -1;  // MemAvailable of /proc/meminfo after the steps; -1 where unknown
};

// `warmup` untimed steps, then `steps` timed ones of the model of cfg on `device` (-1: CPU), paced by
// cfg.emulate with the jitter stream of (cfg.train.seed, node), as node `node` of a job paces them.
StepProbeResult probe_steps(const RunConfig& cfg, int64_t node, int device, int steps, int warmup);

}  // namespace syncopate
