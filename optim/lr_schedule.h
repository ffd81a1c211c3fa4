// Learning-rate schedule: linear warmup, then cosine decay (nanoGPT's get_lr,
// llm.c's warmup). Called once per step with the index of the step about to
// be taken (0-based):
//   step < warmup:            max_lr * (step + 1) / warmup
//   warmup <= step < total:   min_lr + 0.5 (1 + cos(pi r)) (max_lr - min_lr),
//                             r = (step - warmup) / (total_steps - warmup)
//   step >= total_steps:      min_lr
#pragma once

#include <cstdint>

namespace loom::optim {

// Throws for step < 0, warmup < 0, total_steps < 1, warmup > total_steps, or
// not 0 <= min_lr <= max_lr.
double lr_at(int64_t step, double max_lr, int64_t warmup, int64_t total_steps, double min_lr);

}  // namespace loom::optim
