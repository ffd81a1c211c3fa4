// What stops train_gpt rather than let a run go wrong: ranks started with
// other flags or another build (at start-up), ranks that disagree on whether
// an fp16 step was skipped, a loss or grad norm that is no longer finite (each
// step); and --inject-overflow, the test aid that provokes a skipped step.
#pragma once

#include <cstdint>
#include <string>

#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/wrap.h"
#include "parallel/process_group_manager.h"

namespace loom::train {

// The start-up handshake (parallel/comm/handshake.h): every rank's flags
// (CLI11's dump of every option) gathered and compared before the first
// collective; a rank started with other flags stops the job, naming them.
void check_ranks_agree_on_flags(const std::string& flags);

// Under fp16 a step skipped for overflow must be skipped by every rank (one
// found_inf, reduced over the model's ranks): a rank that decided alone is
// reported and the run stops, naming the ranks on each side, instead of
// training stages of different models (or hanging in ZeRO's all-gather).
void check_ranks_agree_on_skip(int64_t step, const optim::StepResult& s, const optim::MixedPrecisionOptimizer& opt,
                               parallel::ProcessGroupManager& pgm);

// A non-finite loss or grad norm on a step that was not skipped for fp16
// overflow (GradScaler's floor covers those) stops the run naming the step -
// before any save, so a good checkpoint is never overwritten with NaN weights.
void stop_if_diverged(int64_t step, double loss, const optim::StepResult& s);

// A test aid (--inject-overflow), not part of training: an inf in one element
// of rank 0's main_grad buffer (HSDP: and its replicas') before backward adds into it.
void inject_overflow(const parallel::DataParallelWrap& dp, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
