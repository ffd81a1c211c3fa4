// What train_gpt reports after each step: one JSON line for --log (step,
// loss, lr, tokens_per_s, ms, grad_norm, loss_scale, skipped, and val_loss on
// evaluation steps) and a human line - a progress line rewritten in place on a
// terminal, plain lines otherwise.
#pragma once

#include <cstdint>
#include <string>

namespace loom::train {

struct StepReport {
  int64_t step, steps;        // this step (from 0), total steps
  double loss, lr, tokens_per_s, ms;
  double grad_norm;           // before clipping
  double loss_scale;          // the scale this step's gradients carried (1: none)
  bool skipped;               // fp16 overflow: the optimizer skipped the step
  double next_loss_scale;     // the scale after this step (backed off when skipped)
  bool evaluated;
  double val_loss;            // when evaluated
  double eta_s;               // seconds left
  double live_mib, peak_mib;  // this process's allocator: bytes live after the step, peak so far (MiB)
  // --experts (nn/moe.h), over the step's layers and micro-batches: the mean load-balancing loss
  // E sum_e f_e P_e (k when balanced), the fraction of token-expert slots dropped for capacity, and
  // the busiest expert's load over the mean load (1 when balanced)
  bool moe = false;
  double moe_balance = 0, moe_dropped = 0, moe_max_load = 0;
};

std::string json_line(const StepReport& r);  // with its trailing newline
void print_progress(const StepReport& r, bool tty);
std::string format_duration(double seconds);  // "3m07s", "1h05m"

}  // namespace loom::train
