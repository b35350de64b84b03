// Learning-rate schedule: linear warmup from warmup_start_lr to the peak over warmup_steps, then
// cosine decay from the peak to min_lr at the last step. Plain functions, no torch.
#pragma once
#include <cstdint>

namespace syncopate {

struct ScheduleConfig {
  int64_t warmup_steps = 10;      // optimizer steps of linear warmup (when warmup_frac is 0)
  double warmup_frac = 0;         // warmup as a fraction of train.steps (rounded, at least 1 step); 0 = warmup_steps.
                                  // Runs of different lengths then warm up over the same share of their schedule
  double warmup_start_lr = 3e-5;  // learning rate at step 0
  double min_lr = 1e-6;           // learning rate reached at the final step

  template <class V>
  void fields(V& v) {
    v("warmup_steps", warmup_steps, "optimizer steps of linear warmup (when warmup_frac = 0)", int64_t{0}, int64_t{1} << 40);
    v("warmup_frac", warmup_frac, "warmup as a fraction of train.steps; 0 = use warmup_steps", 0.0, 0.5);
    v("warmup_start_lr", warmup_start_lr, "learning rate at step 0", 0.0, 10.0);
    v("min_lr", min_lr, "floor of the cosine decay, reached at the last step", 0.0, 10.0);
  }
};

// Learning rate for optimizer step `step` (0-based) of `total_steps`, peak `peak_lr`:
//   step <  warmup:  start + (peak - start) * step / warmup
//   step >= warmup:  min + (peak - min) * (1 + cos(pi * (step - warmup) / max(1, total - 1 - warmup))) / 2
double lr_at(const ScheduleConfig& c, double peak_lr, int64_t step, int64_t total_steps);
// The warmup in steps of a run of total_steps: warmup_steps, or round(warmup_frac * total), at least 1.
int64_t warmup_steps_of(const ScheduleConfig& c, int64_t total_steps);

// The same shape over a share of the schedule instead of its steps (a schedule by the clock:
// progress = elapsed seconds / the budget's): linear warmup over the first warmup_frac, then cosine
// decay to min_lr at progress 1, min_lr past it. warmup_frac must be > 0 (warmup_steps has no meaning here).
//   progress <  w:  start + (peak - start) * progress / w
//   progress >= w:  min + (peak - min) * (1 + cos(pi * min(1, (progress - w) / (1 - w)))) / 2
double lr_at_progress(const ScheduleConfig& c, double peak_lr, double progress);

}  // namespace syncopate
