// train_gpt's wrappers, one helper per step of the wrapping order, so that
// run() in train_gpt.cpp reads grid -> model -> dtype -> finalize step ->
// data parallel -> optimizer -> resume -> loop on one screen. Each helper
// turns this program's flags into the library's options, builds one thing and
// prints its line on rank 0; the decisions themselves live in the library
// (parallel/model.h, parallel/data_parallel/wrap.h, optim/build_optimizer.h,
// parallel/finalize_model_grads.h). The corpus: train/corpus.h; checkpoints
// in and out: train/checkpoint.h; what the loop does each step: train_step.h.
#pragma once

#include <memory>

#include "nn/gpt.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/wrap.h"
#include "parallel/finalize_model_grads.h"
#include "parallel/model.h"
#include "parallel/process_group_manager.h"
#include "train/args.h"

namespace loom::train {

// What this rank trains (parallel/model.h): the layer chunks of its (pp, tp)
// coordinate - every layer on one process, its stage's slice of
// [embedding, block_0 .. block_{L-1}, head] with --pp (by --partition, in
// --virtual-stages chunks), each layer's tp shard with --tp - moved to
// --device. Prints the model's line (and the pipeline's and tp's) on rank 0.
parallel::Model build_model(const nn::GPTConfig& cfg, const Args& a, parallel::ProcessGroupManager& pgm);

// --ep: each MoE layer's experts split over ep consecutive dp ranks, E / ep held
// by each, the tokens sent there and back by all-to-all
// (parallel/expert_parallel/expert_parallel.h); prints its line. The ep group; null without --ep.
parallel::ProcessGroup* expert_parallel(parallel::Model& m, const Args& a, parallel::ProcessGroupManager& pgm);

// The data-parallel wrapper (parallel/data_parallel/wrap.h decides which),
// keeping the tied embedding's buckets whole under --zero; prints its line.
parallel::DataParallelWrap wrap_data_parallel(parallel::Model& m, const parallel::FinalizeModelGrads& finalize,
                                              const Args& a, parallel::ProcessGroupManager& pgm);

// AdamW on fp32 main params, ZeRO-1 with --zero (optim/build_optimizer.h); prints its line.
std::unique_ptr<optim::MixedPrecisionOptimizer> make_optimizer(parallel::Model& m, const parallel::DataParallelWrap& dp,
                                                                const parallel::FinalizeModelGrads& finalize,
                                                                const Args& a, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
