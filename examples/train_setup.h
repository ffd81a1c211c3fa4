// train_gpt's wrappers, one helper per step of the wrapping order, so that
// run() in train_gpt.cpp reads grid -> model -> dtype -> finalize step ->
// data parallel -> optimizer -> resume -> loop on one screen. Each helper
// turns this program's flags into the library's options, builds one thing and
// prints its line on rank 0; the decisions themselves live in the library
// (parallel/model.h, parallel/data_parallel/wrap.h, optim/build_optimizer.h,
// parallel/finalize_model_grads.h).
#pragma once

#include <cstdint>
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
};
Corpus load_corpus(const Args& a, parallel::ProcessGroup& world);

// What this rank trains (parallel/model.h): the layer chunks of its (pp, tp)
// coordinate - every layer on one process, its stage's slice of
// [embedding, block_0 .. block_{L-1}, head] with --pp (by --partition, in
// --virtual-stages chunks), each layer's tp shard with --tp - moved to
// --device. Prints the model's line (and the pipeline's and tp's) on rank 0.
parallel::Model build_model(const nn::GPTConfig& cfg, const Args& a, parallel::ProcessGroupManager& pgm);

// --init-from DIR: the Hugging Face folder's weights into this rank's layers
// (nn/hf_checkpoint.h, parallel/load_full_state.h), before the dtype cast
// and the optimizer's fp32 copy. A no-op without the flag.
void init_from_hf(const Args& a, parallel::Model& m, parallel::ProcessGroupManager& pgm);

// --export-hf DIR: the whole model as a Hugging Face folder, written by rank 0
// (dir.tmp, then renamed), from the last step's params (opt's param sync
// finished first, as a --save does). Collective over world. A no-op without the flag.
void export_hf(const Args& a, const Corpus& c, parallel::Model& m, optim::MixedPrecisionOptimizer& opt,
               parallel::ProcessGroupManager& pgm);

// The data-parallel wrapper (parallel/data_parallel/wrap.h decides which),
// keeping the tied embedding's buckets whole under --zero; prints its line.
parallel::DataParallelWrap wrap_data_parallel(parallel::Model& m, const parallel::FinalizeModelGrads& finalize,
                                              const Args& a, parallel::ProcessGroupManager& pgm);

// AdamW on fp32 main params, ZeRO-1 with --zero (optim/build_optimizer.h); prints its line.
std::unique_ptr<optim::MixedPrecisionOptimizer> make_optimizer(parallel::Model& m, const parallel::DataParallelWrap& dp,
                                                                const parallel::FinalizeModelGrads& finalize,
                                                                const Args& a, parallel::ProcessGroupManager& pgm);

// --resume: fills the optimizer (fp32 main params, AdamW state, loss scale)
// and the model params from the checkpoint's shards, resharding when dp, pp or
// --zero changed, and puts the data generator where it was. Returns the steps
// already done (0 without --resume).
int64_t resume(const Args& a, optim::MixedPrecisionOptimizer& opt, parallel::Model& m, Generator& data_gen);

// --save: the whole model on rank 0 (a pipeline's stages gathered) and every
// rank's optimizer shard (optim/checkpoint.h). Collective over world.
void save(const Args& a, int64_t steps_done, const Corpus& c, parallel::Model& m, optim::MixedPrecisionOptimizer& opt,
          const Generator& data_gen, parallel::ProcessGroupManager& pgm);

// How one step's global batch is cut: dp ranks x micro-batches of --batch
// rows; micro-batches are --grad-accum on one stage, --microbatches in a pipeline.
struct BatchPlan {
  int64_t micro_batches;  // K
  int64_t global_batch;   // dp x batch x K sequences
  int64_t first_row;      // this dp rank's first row in the global batch
};
BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm);
// K: --microbatches (default pp) in a pipeline, else --grad-accum.
int64_t micro_batches_per_step(const Args& a, parallel::ProcessGroupManager& pgm);

// Rows [first_row, first_row + K x batch) of the global batch, as K micro-batches of `batch` rows.
// With cp > 1 each micro-batch holds cp rank cp_rank's zig-zag chunks of its sequences.
std::vector<parallel::MicroBatch> micro_batches(const data::Batch& global, int64_t first_row, int64_t batch, int64_t K,
                                                int cp = 1, int cp_rank = 0);

// The loss back-propagated for one micro-batch: the model's loss (vocab-parallel
// under tp), times the loss scale under fp16.
parallel::LossFn scaled_loss(parallel::Model& m, const optim::MixedPrecisionOptimizer& opt);

// The loss to log: this rank's mean over its micro-batches with the loss
// scale divided out (a power of two: exact), averaged over the dp ranks.
double global_mean_loss(double local_loss, const optim::MixedPrecisionOptimizer& opt,
                        parallel::ProcessGroupManager& pgm);

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
// of rank 0's main_grad buffer before backward adds into it. See train_setup.cpp.
void inject_overflow(const parallel::DataParallelWrap& dp, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
