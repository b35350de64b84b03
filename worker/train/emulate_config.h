// Modelled compute: how long one optimizer step of this node takes on the device it stands for.
// The step's forward and backward still run for real (the model learns, gradients and staleness
// are real); StepPacer then sleeps until the modelled time has passed since the step began, so a
// cluster emulated on a few shared cores behaves like machines that each have their own
// accelerator. Off (step_time_s = 0 and no target) a run behaves exactly as without emulation.
#pragma once
#include <cstdint>
#include <string>

namespace syncopate {

struct EmulateConfig {
  double step_time_s = 0;    // modelled compute time of one optimizer step at slowdown 1, seconds; 0 = off
  double slowdown = 1.0;     // this node's factor on the modelled time (a straggler: e.g. 3 = three times slower)
  int64_t slowdown_from_step = 0;  // the slowdown applies from this step on (a node that slows mid-run); 0 = always
  double jitter = 0;         // per-step noise: the modelled time is multiplied by (1 + X), X exponential with this
                             // mean (a shifted exponential, the usual straggler model); 0 = none. Seeded by
                             // train.seed, the node's rank and the step: reproducible per seed
  double jitter_tail = 0;    // 0: X exponential; > 1: X heavy-tailed, Lomax (Pareto II) of this shape alpha and the
                             // same mean `jitter` (alpha <= 2: infinite variance; 1.5 = rare steps many times the
                             // mean, the tail measured in shared clusters); dimensionless
  // Optional derivation of step_time_s from a target device (used when target_params > 0):
  // step_time_s = dilation * 6 * target_params * target_tokens / (peak_tflops * 1e12 * mfu).
  int64_t target_params = 0;  // parameters of the model the target cluster trains; 0 = use step_time_s
  int64_t target_tokens = 0;  // tokens one target node processes per optimizer step
  double peak_tflops = 989;   // the target device's dense peak, TFLOP/s (H100 SXM bf16)
  double mfu = 0.4;           // model FLOP utilization the target reaches (fraction of peak)
  double dilation = 1.0;      // emulated seconds per target second (slows the whole cluster down uniformly)
  // The modelled step's timeline (overlap): the forward takes forward_share of the modelled time, the
  // backward the rest, producing gradients from the last parameter to the first at an even rate
  // per value. With overlap, a gradient region (a ring bucket, a ps shard's part) is handed to the
  // network no earlier than the modelled moment backward finishes it, so communication overlaps the
  // modelled backward as it would on the device (DDP, BytePS), neither before nor only after it.
  bool overlap = false;       // true: regions released at their modelled times (needs dist.overlap / ps_push_in_backward)
  double forward_share = 1.0 / 3;  // forward's share of the modelled step (6N FLOPs per token: forward 2N, backward 4N)
  // The link's propagation latency: every ring message this node receives is held this long after it
  // arrived (a userspace delay line, DelayedConnection; the kernels here have no netem qdisc), on top of
  // the link's own latency. One way, per message; pipelined segments of one hop share it. Ring mode
  // only: in ps mode the servers hold every message in and out (server.latency_ms).
  double latency_ms = 0;      // one-way propagation delay added to each received ring message, milliseconds; 0 = none
  // The target cluster's checkpoint write: a write holds, before it commits, until this long has
  // passed since it began (a large model on shared storage takes tens of seconds; here the tiny
  // model's takes milliseconds), so that a configuration that checkpoints more, or restarts from
  // checkpoints, pays what it would, and a kill during the modelled write resumes from the
  // checkpoint before. On the training thread the node waits for it (preemption checkpoints too);
  // with checkpoint.background the periodic writes hold on the writer thread instead.
  double checkpoint_s = 0;    // modelled duration of one checkpoint write, seconds; 0 = its real duration

  template <class V>
  void fields(V& v) {
    v("step_time_s", step_time_s, "modelled compute time of one step at slowdown 1, seconds (0 = off)", 0.0, 3600.0);
    v("slowdown", slowdown, "this node's factor on the modelled step time (straggler)", 1.0, 1000.0);
    v("slowdown_from_step", slowdown_from_step, "the step from which the slowdown applies (0 = every step)", int64_t{0},
      int64_t{1} << 40);
    v("jitter", jitter, "mean of the exponential per-step extra time, as a fraction of the step time (0 = none)", 0.0, 100.0);
    v("jitter_tail", jitter_tail, "0: exponential jitter; > 1: heavy-tailed (Lomax of this shape, same mean)", 0.0, 100.0);
    v("target_params", target_params, "target model parameters for deriving step_time_s (0 = use step_time_s)",
      int64_t{0}, int64_t{1} << 50);
    v("target_tokens", target_tokens, "target tokens per node per step, for the derivation", int64_t{0}, int64_t{1} << 40);
    v("peak_tflops", peak_tflops, "target device peak, TFLOP/s, for the derivation", 1e-3, 1e6);
    v("mfu", mfu, "target model FLOP utilization (0, 1], for the derivation", 1e-4, 1.0);
    v("dilation", dilation, "emulated seconds per target second, for the derivation", 1e-6, 1e9);
    v("overlap", overlap, "release gradient regions at their modelled times during the modelled backward");
    v("forward_share", forward_share, "forward's share of the modelled step time (the rest is backward)", 0.0, 0.99);
    v("checkpoint_s", checkpoint_s, "modelled duration of one checkpoint write, held before it commits, seconds (0 = its real duration)", 0.0,
      86400.0);
    v("latency_ms", latency_ms, "one-way delay added to every ring message this node receives, ms (ring only; ps: server.latency_ms)",
      0.0, 60000.0);
  }

  // The modelled step time at slowdown 1 (the derivation when target_params > 0), seconds.
  double base_step_s() const {
    if (target_params > 0)
      return dilation * 6.0 * static_cast<double>(target_params) * static_cast<double>(target_tokens) / (peak_tflops * 1e12 * mfu);
    return step_time_s;
  }
  bool enabled() const { return base_step_s() > 0; }
  // Cross-field checks; throws syncopate::Error with the field's name and how to fix it.
  void validate() const;
};

}  // namespace syncopate
