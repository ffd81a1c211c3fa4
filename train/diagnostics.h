// Everything train_gpt does around a step that changes none of its numbers:
// the clock and the progress line (a terminal line rewritten in place, plain
// lines otherwise), --log's JSON lines, --memory-report, --print-schedule, the
// validation loss, --trace and the final sample. llm.c's "TRAINING SECTION
// END: everything that follows is diagnostics" - kept out of the training step.
#pragma once

#include <chrono>
#include <fstream>

#include "nn/moe.h"
#include "optim/activation_memory.h"
#include "optim/pipeline_activations.h"
#include "optim/memory_report.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/wrap.h"
#include "parallel/model.h"
#include "parallel/process_group_manager.h"
#include "parallel/trace/schedule_diagram.h"
#include "train/args.h"
#include "tensor/cuda/launch_count.h"
#include "train/corpus.h"

namespace loom::train {

class Diagnostics {
 public:
  // Opens --log (appended to when resuming at start > 0). Steps [start, end) will run.
  Diagnostics(const Args& a, parallel::ProcessGroupManager& pgm, const Corpus& c, parallel::Model& m,
              const parallel::DataParallelWrap& dp, optim::MixedPrecisionOptimizer& opt, int64_t start, int64_t end,
              int64_t tokens_per_step);

  // Before the step: starts its clock; on the first step with --memory-report
  // records the live bytes and resets the peak.
  void step_begins(int64_t step);
  // After backward, before the optimizer allocates or steps anything: the
  // activations' peak for --memory-report.
  void backward_done();
  // After the optimizer step: --memory-report and --print-schedule on the
  // first step, the validation loss every --eval-every steps, the progress
  // line and the --log line.
  void step_done(int64_t step, double loss, double lr, const optim::StepResult& stepped,
                 const parallel::StageEvents& events);
  // After the loop: ends the progress line on a terminal.
  void end_progress_line();
  // Last: --trace, then a sample of --sample characters from the
  // model (a pipeline's stages gathered into one GPT on rank 0 first).
  void finish();

 private:
  // --memory-report's formulas for this rank: its buckets (their padding, ZeRO-2's shards), the activations' peak.
  optim::BucketedParams bucketed_params() const;
  int64_t expert_params() const;
  int expert_parallel_ranks() const;
  int sync_ranks() const;
  // [chunk] its units are gathered while this rank's last layer waits for its backward (ZeRO-3's working set).
  std::vector<bool> chunks_beside_held_unit() const;
  double predicted_activation_bytes() const;
  double costliest_micro_batch(const optim::ActivationCase& c) const;
  void micro_batch_routing(const std::vector<nn::MoE*>& moe, optim::ActivationCase& c, size_t micro_batch) const;
  double pipeline_rows_walk(const std::vector<nn::MoE*>& moe, const optim::ActivationCase& c) const;
  std::vector<std::vector<optim::RoutedRows>> chunk_rows(const optim::ActivationCase& c) const;
  double costliest_rerun(const std::vector<nn::MoE*>& moe, const optim::ActivationCase& c, size_t micro_batch) const;
  optim::ActivationCase rerun_case(const std::vector<nn::MoE*>& moe, size_t block, const optim::ActivationCase& c,
                                   size_t micro_batch) const;
  void received_rows(const std::vector<nn::MoE*>& moe, optim::ActivationCase& c, size_t micro_batch) const;
  std::vector<int64_t> local_groups(nn::MoE& layer, size_t micro_batch) const;

  const Args& a_;
  const Device device_;  // where the model lives: its memory is what the report and the log count
  parallel::ProcessGroupManager& pgm_;
  const Corpus& c_;
  parallel::Model& m_;
  const parallel::DataParallelWrap& dp_;
  optim::MixedPrecisionOptimizer& opt_;
  const int64_t start_, end_, tokens_per_step_;
  const bool rank0_, tty_;
  std::ofstream log_;
  std::chrono::steady_clock::time_point t0_;
  double total_ms_ = 0;
  int64_t live_before_ = 0, peak_ = 0;
  // --trace on a GPU: the kernels, cuBLAS calls, memsets and device copies each step enqueued
  // (tensor/cuda/launch_count.h), taken before the diagnostics launch anything, printed by finish().
  cuda::LaunchWindow launches_;
  std::vector<int64_t> launches_per_step_;
};

}  // namespace loom::train
