// train_gpt's wrappers, one helper per step of the wrapping order, so that
// run() in train_gpt.cpp reads grid -> model -> dtype -> finalize step ->
// data parallel -> optimizer -> resume -> loop on one screen. Each helper
// turns this program's flags into the library's options, builds one thing and
// prints its line on rank 0; the decisions themselves live in the library
// (parallel/model.h, parallel/data_parallel/wrap.h, optim/build_optimizer.h,
// parallel/finalize_model_grads.h). Checkpoints in and out: train_checkpoint.h;
// what the loop does each step: train_step.h.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/data.h"
#include "examples/train_args.h"
#include "examples/train_tokenizer.h"
#include "nn/gpt.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/wrap.h"
#include "parallel/finalize_model_grads.h"
#include "parallel/microbatch_runner.h"
#include "parallel/model.h"
#include "parallel/process_group_manager.h"

namespace loom::train {

DType parse_dtype(const std::string& s);  // "fp32" | "bf16" | "fp16"

// printf on rank 0 only: each helper's line.
template <typename... Args>
void say(bool rank0, const char* fmt, Args... args) {
  if (rank0) std::printf(fmt, args...);
}

// The start-up handshake (parallel/comm/handshake.h): every rank's flags
// (CLI11's dump of every option) gathered and compared before the first
// collective; a rank started with other flags stops the job, naming them.
void check_ranks_agree_on_flags(const std::string& flags);

// The text, its tokenizer (characters, or --tokenizer's BPE), the train/val split and the model config.
// Every rank reads the corpus and later draws the same global batches; the
// corpus's size and hash are compared over world first. With --resume the
// checkpoint's config and vocabulary win over the flags.
struct Corpus {
  Tokenizer tok;
  data::TextDataset ds;
  nn::GPTConfig cfg;
  int64_t eod = -1;  // --eod-mask-loss's token id (-1: off)
};
Corpus load_corpus(const Args& a, parallel::ProcessGroup& world);

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
