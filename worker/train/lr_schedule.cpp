#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace syncopate {

int64_t warmup_steps_of(const ScheduleConfig& c, int64_t total) {
  if (c.warmup_frac <= 0) return c.warmup_steps;
  return std::max<int64_t>(1, std::llround(c.warmup_frac * static_cast<double>(total)));
}

double lr_at(const ScheduleConfig& c, double peak, int64_t step, int64_t total) {
  const int64_t warmup = warmup_steps_of(c, total);
  if (step < warmup)
    return c.warmup_start_lr + (peak - c.warmup_start_lr) * static_cast<double>(step) / warmup;
  const double span = static_cast<double>(std::max<int64_t>(1, total - 1 - warmup));
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return c.min_lr + (peak - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double lr_at_progress(const ScheduleConfig& c, double peak, double progress) {
  const double w = c.warmup_frac;
  if (progress < w) return c.warmup_start_lr + (peak - c.warmup_start_lr) * std::max(0.0, progress) / w;
  const double decay = std::min(1.0, (progress - w) / std::max(1e-12, 1.0 - w));
  return c.min_lr + (peak - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * decay));
}

}  // namespace syncopate
