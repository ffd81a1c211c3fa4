// MixedPrecisionOptimizer: AdamW on fp32 "main" params for a model whose
// params may be bf16 or fp16 (Micikevicius et al. 2018; Megatron-LM's
// MixedPrecisionOptimizer / Float16OptimizerWithFloat16Params).
//
// Why main params: an update lr * m / sqrt(v) is often ~1e-4 of the weight; bf16
// keeps 8 bits of mantissa (relative step 2^-8 = 4e-3), so adding it to a bf16
// weight rounds it away and training stalls. The optimizer therefore keeps an
// fp32 copy of every weight, steps that copy with fp32 gradients, and only then
// rounds it into the bf16 model param that forward and backward use.
//
// Where the pieces live, per parameter (bf16 model, Adam):
//   model param       bf16  2 bytes   the model's tensor; forward/backward read it
//   main_grad         fp32  4 bytes   DataParallelBucket's buffer: grads accumulate here
//   main param        fp32  4 bytes   } the optimizer state, 12 bytes;
//   exp_avg, exp_avg_sq fp32 8 bytes  } DistributedOptimizer shards them: 12/dp
// For an fp32 model the main param *is* the model param (a view, no copy, as
// Megatron's FP32Optimizer), so this class is also loom's plain fp32 optimizer.
//
// step(), Megatron's order:
//   1. gather the main grads          fp32 views of main_grad (or .grad made fp32)
//   2. unscale, found_inf             fp16 loss scaling: grads *= 1/scale; one flag per
//                                     rank, all-reduced (MAX) over grad_stats_group, so
//                                     every pipeline stage skips the same step
//   3. skip?                          params and optimizer state untouched; scale halves
//   4. grad norm, clip                sum of squares all-reduced over grad_stats_group
//                                     (the tied weight's duplicate copy not counted)
//   5. AdamW on the main params       one fused loop per main param over the element
//                                     math of tensor/kernels/adamw.h (llm.c's gpt2_update)
//   6. main -> model params           rounded to bf16/fp16; nothing to do for fp32
#pragma once

#include <memory>
#include <vector>

#include "optim/adamw.h"
#include "optim/grad_scaler.h"
#include "parallel/comm/process_group.h"

namespace loom::optim {

// One fp32 tensor the optimizer updates: a whole model param, or (ZeRO-1,
// distributed_optimizer.h) the part of it this data-parallel rank owns.
struct MainParam {
  Tensor model_param;           // the model's tensor: fp32, bf16 or fp16, any shape
  int64_t start = 0, end = 0;   // covers elements [start, end) of model_param flattened
  Tensor main;                  // fp32 [end - start]; for an fp32 model param a view into it
  size_t group = 0;             // param group (lr, weight decay)
  bool counted_in_norm = true;  // false for the duplicate copy of a tied weight
};

struct MixedPrecisionOptions {
  double max_grad_norm = 0;    // clip the main grads to this global norm (0: no clipping)
  bool loss_scaling = false;   // fp16: a dynamic GradScaler
  GradScalerOptions scaler = {};
  // The ranks whose gradients the data-parallel reduction averages (dp x cp).
  // Each one's loss is a mean over 1/grad_mean_ranks of the global batch's
  // tokens, so its backward at the full scale S would carry activation
  // gradients grad_mean_ranks times one process's, and overflow fp16 where one
  // process does not. Each rank's backward therefore carries S / grad_mean_ranks
  // (backward_scale()): its activation gradients are one process's, and the
  // average of the ranks' gradients is unscaled by that same factor.
  int grad_mean_ranks = 1;
  AdamWOptions adam = {};
  // The ranks that together hold every gradient of the model once, over which
  // the norm and found_inf are reduced: the model-parallel group (all pipeline
  // stages); the whole world under ZeRO-1, where each data-parallel rank holds
  // one shard. nullptr: this rank alone.
  parallel::ProcessGroup* grad_stats_group = nullptr;
  std::vector<Tensor> not_counted = {};  // model params left out of the norm (the last stage's wte copy)
};

struct StepResult {
  bool skipped = false;   // an inf/nan gradient somewhere in the model: nothing was updated
  double grad_norm = 0;   // global norm of the (unscaled) main grads before clipping
  double loss_scale = 1;  // the scale this step's gradients carried (1 without loss scaling)
};

class MixedPrecisionOptimizer {
 public:
  // groups: the model's params (any floating dtype), with lr and weight decay.
  // main_grad_of(p): p's gradient in fp32 (DataParallelBucket::main_grad), or
  // an undefined tensor if p has none; default: .grad converted to fp32.
  MixedPrecisionOptimizer(std::vector<ParamGroup> groups, MixedPrecisionOptions options = {},
                          Optimizer::GradSource main_grad_of = nullptr);
  virtual ~MixedPrecisionOptimizer();
  MixedPrecisionOptimizer(const MixedPrecisionOptimizer&) = delete;
  MixedPrecisionOptimizer& operator=(const MixedPrecisionOptimizer&) = delete;

  // loss * backward_scale() under loss scaling, else loss itself.
  Tensor scale_loss(const Tensor& loss) const;
  // The factor this rank's backward carries: the loss scale / grad_mean_ranks; 1 without loss scaling.
  double backward_scale() const;
  // Steps 1-6 above. Collective over grad_stats_group.
  virtual StepResult step();
  void set_lr(double lr);

  // Copies the main params into the model params (step 6), e.g. after a
  // checkpoint's main params were loaded. Collective under ZeRO-1.
  virtual void refresh_model_params();
  // Waits until the model params hold the last step's values: a no-op here,
  // the param all-gathers under ZeRO-1 (distributed_optimizer.h). Call before
  // anything reads the params: the next forward, an evaluation, a checkpoint.
  virtual void finish_param_sync() {}
  // At the top of each training step, before its forward: what the params
  // need first. finish_param_sync() here; nothing under ZeRO-1 with
  // overlap_param_gather() (each layer's pre-hook waits for its own buckets)
  // or under ZeRO-3 (each unit gathers itself in its pre-hook).
  virtual void before_forward() { finish_param_sync(); }
  // The buffer the model params live in when the optimizer owns one (ZeRO-1's
  // all-gathered param buffer, for --memory-report); undefined here.
  virtual const Tensor& param_buffer() const {
    static const Tensor none;
    return none;
  }
  // The ranks over which the main params are sharded (ZeRO: each owns a
  // disjoint range of the same model params, and together they hold each
  // element once) - the data-parallel group its wrapper reduce-scatters over,
  // dp x cp. nullptr here: every main param is whole. What a checkpoint joins the shards over.
  virtual parallel::ProcessGroup* shard_group() const { return nullptr; }

  const std::vector<MainParam>& main_params() const { return mains_; }
  // The AdamW state (step, exp_avg, exp_avg_sq) of main_params()[i].
  const AdamWState& adam_state(size_t i) const { return adam_.at(i); }
  GradScaler* scaler() { return scaler_.get(); }
  const GradScaler* scaler() const { return scaler_.get(); }
  const MixedPrecisionOptions& options() const { return options_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

 protected:
  // For DistributedOptimizer: main params built by the caller.
  MixedPrecisionOptimizer(std::vector<ParamGroup> groups, std::vector<MainParam> mains,
                          MixedPrecisionOptions options, Optimizer::GradSource main_grad_of);

  // Main param i's gradient: fp32 [end - start], undefined if it has none.
  virtual Tensor main_grad(size_t i) const;
  // Steps 2-4 on the given main grads; returns false (and counts the skip) on an overflow.
  bool unscale_and_clip(const std::vector<Tensor>& grads, StepResult& result);
  // Step 5 for main param i (nothing without a gradient, as in PyTorch).
  void adam_step(size_t i, const Tensor& grad);
  // Step 6 for main param i.
  void copy_to_model(size_t i);

  std::vector<ParamGroup> groups_;
  std::vector<MainParam> mains_;
  MixedPrecisionOptions options_;

 private:
  Optimizer::GradSource main_grad_of_;
  std::unique_ptr<GradScaler> scaler_;
  std::vector<AdamWState> adam_;  // [main param]: step [] int64, exp_avg and exp_avg_sq [end - start] fp32
};

// A fp32 contiguous view [end - start] of elements [start, end) of t flattened.
Tensor flat_range(const Tensor& t, int64_t start, int64_t end);

}  // namespace loom::optim
