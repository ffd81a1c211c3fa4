// The optimizer a training program builds over its model, decided in one
// place: AdamW on fp32 main params (mixed_precision_optimizer.h) with
// nanoGPT's param groups, sharded over dp with ZeRO-1
// (distributed_optimizer.h: it shards the bucketed main_grad buffer) or the
// shards of ZeRO-3's units (fully_sharded_optimizer.h), and
// told by finalize_model_grads where the grad norm and found_inf are reduced
// and which params another rank already counts.
#pragma once

#include <memory>

#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/wrap.h"
#include "parallel/finalize_model_grads.h"

namespace loom::optim {

struct OptimizerOptions {
  double lr = 3e-4, weight_decay = 0.1;
  double max_grad_norm = 0;       // clip to this global norm (0: no clipping)
  bool loss_scaling = false;      // fp16: a dynamic GradScaler
  GradScalerOptions scaler = {};
  int grad_mean_ranks = 1;        // dp x cp: MixedPrecisionOptions::grad_mean_ranks
  int zero = 0;                       // ZeRO stage; 1/2 need dp.zero (the main_grad buffer), 3 dp.fsdp
  bool overlap_param_gather = false;  // ZeRO-1: each layer waits for its own param all-gathers
};

std::unique_ptr<MixedPrecisionOptimizer> build_optimizer(parallel::Model& model, const parallel::DataParallelWrap& dp,
                                                         const parallel::FinalizeModelGrads& finalize,
                                                         const OptimizerOptions& options);

}  // namespace loom::optim
