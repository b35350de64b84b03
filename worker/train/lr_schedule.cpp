#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace syncopate {

double lr_at(const ScheduleConfig& c, double peak, int64_t step, int64_t total) {
  if (step < c.warmup_steps)
    return c.warmup_start_lr + (peak - c.warmup_start_lr) * static_cast<double>(step) / c.warmup_steps;
  const double span = static_cast<double>(std::max<int64_t>(1, total - 1 - c.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  return c.min_lr + (peak - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace syncopate
