// Everything one training run is configured by: one plain struct per concern, bound to the
// TOML file's [section]s and to --section.field=value overrides by bind().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/config_schema.h"
#include "common/flat_adamw.h"
#include "common/trace.h"
#include "model/gpt_config.h"
#include "worker/data/data_config.h"
#include "worker/sync/dist_config.h"
#include "worker/train/emulate_config.h"
#include "worker/train/lr_schedule.h"

namespace syncopate {

struct TrainConfig {
  int64_t steps = 2000;          // optimizer steps of the run
  int64_t batch_size = 16;       // sequences per micro-batch (per replica)
  int64_t grad_accum = 1;        // micro-batches accumulated into one optimizer step
  int64_t seed = 1337;           // seeds weights, dropout and data order
  std::string device = "auto";   // "auto" (CUDA if available), "cpu", "cuda"
  std::string precision = "auto";  // "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32", "bf16"
  int64_t threads = 0;           // CPU intra-op threads; 0 = LibTorch's default
  double peak_tflops = 0;        // one device's peak dense TFLOP/s at the training precision (H100 SXM bf16: 989);
                                 // > 0 adds `mfu` per step to metrics (per device: the step's replicas share it)
  int64_t log_every = 10;        // steps between plain-text progress lines (no terminal)
  double skip_grad_norm = 0;     // a step whose averaged gradient has a larger L2 norm (before clipping) is skipped,
                                 // like one with a non-finite gradient (always skipped); 0 = no bound
  int64_t max_skipped_steps = 5; // this many skipped steps in a row end the run with an error
  bool deterministic = false;    // LibTorch's deterministic kernels (warn-only where it has none), cuDNN deterministic,
                                 // cuBLAS's fixed workspace: runs repeat bit for bit on one GPU, somewhat slower
                                 // (worker/train/determinism.h)
  double preempt_grace_s = 60;    // after a SIGTERM (a preemption notice) the run stops at the next step boundary,
                                  // writes a checkpoint and leaves the job; a process not gone this many seconds
                                  // later (a step stuck waiting) exits at once with status 143, as does a second SIGTERM

  template <class V>
  void fields(V& v) {
    v("steps", steps, "optimizer steps", int64_t{1}, int64_t{1} << 40);
    v("batch_size", batch_size, "sequences per micro-batch per replica", int64_t{1}, int64_t{1} << 20);
    v("grad_accum", grad_accum, "micro-batches per optimizer step", int64_t{1}, int64_t{1} << 20);
    v("seed", seed, "seed of weights, dropout and data order", int64_t{0}, int64_t{1} << 62);
    v("device", device, "compute device", std::vector<std::string>{"auto", "cpu", "cuda"});
    v("precision", precision, "compute precision (weights stay fp32)", std::vector<std::string>{"auto", "fp32", "bf16"});
    v("threads", threads, "CPU threads for LibTorch ops; 0 = default", int64_t{0}, int64_t{4096});
    v("peak_tflops", peak_tflops, "one device's peak TFLOP/s; > 0 logs mfu per step", 0.0, 1e6);
    v("log_every", log_every, "steps between progress lines when not on a terminal", int64_t{1}, int64_t{1} << 40);
    v("skip_grad_norm", skip_grad_norm, "skip a step whose gradient norm exceeds this (non-finite: always); 0 = off",
      0.0, 1e30);
    v("max_skipped_steps", max_skipped_steps, "consecutive skipped steps that end the run", int64_t{1}, int64_t{1} << 40);
    v("deterministic", deterministic, "deterministic GPU kernels where LibTorch has them (runs repeat bit for bit)");
    v("preempt_grace_s", preempt_grace_s, "after SIGTERM: seconds to stop at a step boundary before exiting at once (143)",
      0.1, 86400.0);
  }
};

struct EvalConfig {
  int64_t every = 250;            // steps between validation-loss evaluations; 0 = only at the end
  int64_t every_tokens = 0;       // > 0: evaluate instead whenever the job's tokens cross a multiple of this (the job's
                                  // count from this node's: steps x the node count where nodes step apart), so that
                                  // configurations of a study evaluate at the same global token counts; and at the end
  int64_t batches = 8;            // validation batches per evaluation when val_windows is 0
  int64_t val_windows = 0;        // windows of the held-out set (context+1 tokens each); 0 = batches x train.batch_size.
                                  // Studies use 512 (65,536 tokens with block 128)
  int64_t val_seed = 1;           // picks the held-out windows; independent of train.seed, so every seed and every
                                  // configuration is scored on the same tokens (records carry the set's digest)
  bool defer = false;             // true: at each evaluation point only a snapshot of the weights the job would ship is
                                  // kept (in memory); all are evaluated after the last step, so evaluating costs no
                                  // node any training time (studies). false: evaluated on the spot
  int64_t defer_memory_mb = 2048; // eval.defer: snapshots are kept in memory up to this many MiB in all; further ones
                                  // are written to OUT/deferred/ (float32) and read back when scored, then removed
  int64_t sample_every = 500;     // steps between greedy text samples; 0 = only at the end
  std::string sample_prompt = "def ";  // prompt of the text sample
  int64_t sample_tokens = 96;     // tokens generated per sample

  // Whether an evaluation is due after a node's step `step` that took the job's token count from
  // job_tokens_before to job_tokens_after: every_tokens > 0, when the count crossed a multiple of it;
  // else every `every` steps. (The run's last step is always evaluated: the caller's to add.)
  bool due(int64_t step, int64_t job_tokens_before, int64_t job_tokens_after) const {
    if (every_tokens > 0) return job_tokens_after / every_tokens > job_tokens_before / every_tokens;
    return every > 0 && step % every == 0;
  }

  template <class V>
  void fields(V& v) {
    v("every", every, "steps between validation evaluations (0 = end only)", int64_t{0}, int64_t{1} << 40);
    v("every_tokens", every_tokens, "evaluate whenever the job's tokens cross a multiple of this (0 = use every)",
      int64_t{0}, int64_t{1} << 50);
    v("batches", batches, "validation batches per evaluation (when val_windows = 0)", int64_t{1}, int64_t{1} << 20);
    v("val_windows", val_windows, "held-out windows per evaluation; 0 = batches x train.batch_size", int64_t{0},
      int64_t{1} << 24);
    v("val_seed", val_seed, "seed that picks the held-out windows (not train.seed: the same set for every seed)",
      int64_t{0}, int64_t{1} << 62);
    v("defer", defer, "snapshot the shipped weights at each evaluation point, evaluate them after training (no node time)");
    v("defer_memory_mb", defer_memory_mb, "MiB of deferred snapshots kept in memory; further ones go to OUT/deferred/",
      int64_t{0}, int64_t{1} << 30);
    v("sample_every", sample_every, "steps between text samples (0 = end only)", int64_t{0}, int64_t{1} << 40);
    v("sample_prompt", sample_prompt, "prompt for text samples");
    v("sample_tokens", sample_tokens, "tokens per text sample", int64_t{0}, int64_t{1} << 20);
  }
};

struct CheckpointConfig {
  int64_t every = 500;  // steps between checkpoints (one is always written at the end); 0 = end only
  int64_t keep = 3;     // most recent checkpoints kept; older ones are deleted
  // false: a checkpoint is written on the training thread (the step waits for the whole write).
  // true: the periodic checkpoints are snapshotted to host memory (one more copy of the weights,
  // moments and sync state) and written by a background thread while training goes on; a step
  // waits only if the previous write has not finished. A kill while a write is in flight resumes
  // from the checkpoint before it. The run's last checkpoint (end, SIGTERM, a switch) is written on
  // the training thread once the one in flight has committed (a SIGTERM can take two writes: give
  // train.preempt_grace_s room for them) (worker/checkpoint/checkpoint_writer.h).
  bool background = false;

  template <class V>
  void fields(V& v) {
    v("every", every, "steps between checkpoints (0 = end only)", int64_t{0}, int64_t{1} << 40);
    v("keep", keep, "checkpoints kept", int64_t{1}, int64_t{1} << 20);
    v("background", background, "write periodic checkpoints from a host-memory snapshot on a background thread");
  }
};

// The embedded default (no --config) is the demo: the tiny preset on the byte-tokenized Python
// standard library, 2000 steps (about 2 minutes on 2 CPU cores), with a learning rate suited to
// a tiny model (the GPT-2 articles use optim.lr=6e-4, schedule.min_lr=1e-6 for gpt2).
struct RunConfig {
  RunConfig() {
    optim.lr = 2e-3;
    schedule.min_lr = 1e-4;
  }
  GPTConfig model;
  DataConfig data;
  TrainConfig train;
  AdamWConfig optim;
  ScheduleConfig schedule;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  DistConfig dist;
  EmulateConfig emulate;  // modelled compute for emulated clusters (off by default)
  TraceConfig trace;      // timeline of this worker process (off by default)

  void bind(ConfigSchema& s) {
    s.section("model", model);
    s.section("data", data);
    s.section("train", train);
    s.section("optim", optim);
    s.section("schedule", schedule);
    s.section("eval", eval);
    s.section("checkpoint", checkpoint);
    s.section("dist", dist);
    s.section("emulate", emulate);
    s.section("trace", trace);
  }
  // What every node of a ring job must agree on: a digest of the model, optimizer, schedule, batch
  // and seed, then the [dist] fields that decide how nodes synchronize, written out (a mismatch at
  // the rendezvous then names the field).
  std::string fingerprint() const;
  // Digest of the model's shape alone (what every worker of a parameter-server job must share;
  // their steps and schedules may differ).
  std::string model_fingerprint() const;
  // Cross-field checks, with messages that say how to fix the problem.
  void validate() const;
};

}  // namespace syncopate
