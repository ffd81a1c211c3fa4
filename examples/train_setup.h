// train_gpt's wrappers, one helper per step of the wrapping order, so that
// run() in train_gpt.cpp reads grid -> model or pipeline stage -> dtype ->
// tied-embedding handler -> data parallel -> optimizer -> resume -> loop on one
// screen. Each helper builds one thing, prints its line on rank 0, and says
// here which decision it takes. The library pieces they put together live in
// nn/, parallel/ and optim/; what is here is about this program's flags.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/data.h"
#include "examples/train_args.h"
#include "nn/gpt.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/pipeline_parallel/pipeline_p2p.h"
#include "parallel/pipeline_parallel/pipeline_stage.h"
#include "parallel/pipeline_parallel/shared_weights.h"
#include "parallel/process_group_manager.h"

namespace loom::train {

DType parse_dtype(const std::string& s);  // "fp32" | "bf16" | "fp16"

// The start-up handshake (parallel/comm/handshake.h): every rank's flags
// (CLI11's dump of every option) gathered and compared before the first
// collective; a rank started with other flags stops the job, naming them.
void check_ranks_agree_on_flags(const std::string& flags);

// The text, its character tokenizer, the train/val split and the model config.
// Every rank reads the corpus and later draws the same global batches; the
// corpus's size and hash are compared over world first. With --resume the
// checkpoint's config and vocabulary win over the flags.
struct Corpus {
  data::CharTokenizer tok;
  data::TextDataset ds;
  nn::GPTConfig cfg;
};
Corpus load_corpus(const Args& a, parallel::ProcessGroup& world);

// What this rank trains: the whole GPT on one process, or with --pp only its
// stage's slice of [embedding, block_0 .. block_{L-1}, head]
// (parallel/pipeline_parallel/partition.h), plus the p2p link to its
// neighbours. With --tp the stage's layers are this rank's tp shards
// (tensor_parallel/gpt.h); without --pp that is one stage of every layer, run
// by the same schedule code (one stage, no transfers).
struct ModelOrStage {
  std::shared_ptr<nn::GPT> model;                  // without --pp or --tp
  std::shared_ptr<parallel::PipelineStage> stage;  // with --pp or --tp
  std::unique_ptr<parallel::PipelineP2P> p2p;      // with --pp or --tp (a group of one without --pp)
  bool pipelined() const { return stage != nullptr; }
  nn::Module& net() const { return pipelined() ? static_cast<nn::Module&>(*stage) : *model; }
};
ModelOrStage build_model_or_stage(const nn::GPTConfig& cfg, const Args& a, parallel::ProcessGroupManager& pgm);

// The tied embedding across the first and last pipeline stage (Megatron's
// embedding group); empty without a pipeline, or when one stage holds both.
// With --sequence-parallel also the layernorms and row-parallel biases, whose
// gradients are summed over the tp group.
parallel::SharedWeightGradHandler tied_embedding_handler(ModelOrStage& m, parallel::ProcessGroupManager& pgm);

// The data-parallel wrapper, which also owns the fp32 main_grad buffer.
// Gradients accumulate in DataParallelBucket's main_grad buffer whenever there
// is more than one replica, the model is not fp32 (bf16 sums lose bits), or
// the optimizer is sharded (ZeRO-1 shards that buffer) - on a single process
// too, as a dp group of one (Megatron always wraps in DDP). --dp-mode naive
// has no buffer: it only serves fp32 replicas without --zero.
struct DataParallelWrap {
  std::unique_ptr<parallel::DataParallel> dp;      // null: one fp32 process, plain .grad tensors
  parallel::DataParallelBucket* bucket = nullptr;  // == dp when it holds the main_grad buffer
  void zero_grad(nn::Module& net);
};
DataParallelWrap wrap_data_parallel(ModelOrStage& m, const parallel::SharedWeightGradHandler& tied, const Args& a,
                                    parallel::ProcessGroupManager& pgm);

// AdamW on fp32 main params (optim/mixed_precision_optimizer.h), with nanoGPT's
// param groups; sharded over dp (ZeRO-1, optim/distributed_optimizer.h) with
// --zero, which needs the bucketed main_grad buffer.
std::unique_ptr<optim::MixedPrecisionOptimizer> make_optimizer(ModelOrStage& m, const DataParallelWrap& dp,
                                                                const Args& a, parallel::ProcessGroupManager& pgm);

// Under ZeRO the params are views into the all-gathered param buffer: waits
// for the all-gathers before anything reads them. A no-op otherwise.
void finish_param_sync(optim::MixedPrecisionOptimizer& opt);

// --resume: fills the optimizer (fp32 main params, AdamW state, loss scale)
// and the model params from the checkpoint's shards, resharding when dp, pp or
// --zero changed, and puts the data generator where it was. Returns the steps
// already done (0 without --resume).
int64_t resume(const Args& a, optim::MixedPrecisionOptimizer& opt, ModelOrStage& m, Generator& data_gen);

// --save: the whole model on rank 0 (a pipeline's stages gathered) and every
// rank's optimizer shard (optim/checkpoint.h). Collective over world.
void save(const Args& a, int64_t steps_done, const Corpus& c, ModelOrStage& m, optim::MixedPrecisionOptimizer& opt,
          const Generator& data_gen, parallel::ProcessGroupManager& pgm);

// How one step's global batch is cut: dp ranks x micro-batches of --batch
// rows; micro-batches are --grad-accum on one stage, --microbatches in a pipeline.
struct BatchPlan {
  int64_t micro_batches;  // K
  int64_t global_batch;   // dp x batch x K sequences
  int64_t first_row;      // this dp rank's first row in the global batch
};
BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm);

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
void inject_overflow(const DataParallelWrap& dp, parallel::ProcessGroupManager& pgm);

}  // namespace loom::train
