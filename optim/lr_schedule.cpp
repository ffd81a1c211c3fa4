#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "tensor/error.h"

namespace loom::optim {

double lr_at(int64_t step, double max_lr, int64_t warmup, int64_t total_steps, double min_lr) {
  LOOM_CHECK(step >= 0, "lr_at: step must be >= 0, got ", step);
  LOOM_CHECK(total_steps >= 1, "lr_at: total_steps must be >= 1, got ", total_steps);
  LOOM_CHECK(warmup >= 0 && warmup <= total_steps, "lr_at: warmup must be in [0, total_steps = ", total_steps,
             "], got ", warmup);
  LOOM_CHECK(min_lr >= 0 && min_lr <= max_lr, "lr_at: need 0 <= min_lr <= max_lr, got min_lr ", min_lr,
             " and max_lr ", max_lr);
  if (step < warmup) return max_lr * double(step + 1) / double(warmup);
  if (step >= total_steps) return min_lr;
  double r = double(step - warmup) / double(total_steps - warmup);  // 0 -> 1 over the decay
  double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * r));       // 1 -> 0
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace loom::optim
