// finalize_model_grads: what happens to the gradients after every step's
// backward and before the optimizer (Megatron's finalize_model_grads, called
// by every schedule of its training loop), in one place. The data-parallel
// sync is already finished: the schedule waited for it after its last
// transfer (MicroBatchRunner::finish, microbatch_runner.h). Then:
//   1. the tied embedding                 its copies on the first and last
//                                         stage summed over the embedding
//                                         group (pipeline_parallel/shared_weights.h)
//   2. sequence-parallel partial grads    the layernorms and row-parallel
//                                         biases, each tp rank's sum over its
//                                         T / tp tokens, summed over tp
//                                         (Megatron's allreduce_layernorm_grads;
//                                         under ZeRO the wrapper did it before its
//                                         reduce-scatter, which leaves only shards)
// and what the optimizer must know to reduce the grad norm and found_inf:
//   grad_stats_group   the ranks that together hold every gradient once: the
//                      model-parallel group (pp x tp), the whole world when
//                      ZeRO shards the gradients over dp too, pp x tp x ep when
//                      the ep ranks hold different experts, this rank alone
//                      on one process (replicas hold the same numbers)
//   not_counted        params whose gradient another rank already counts: the
//                      last stage's copy of the tied embedding, the tp
//                      replicas of tp ranks other than 0, and under ep every
//                      param but the experts on ep ranks other than 0 (under
//                      ZeRO none of these: every element is on one shard)
//
//   FinalizeModelGrads finalize(model, pgm);                 // broadcasts the tied embedding
//   dp = wrap_data_parallel(..., finalize.needs_whole_grad()); // ZeRO keeps those buckets whole
//   ... forward_backward(...);   // ends with the dp sync finished
//   finalize(dp); optimizer.step();
#pragma once

#include <vector>

#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/model.h"
#include "parallel/pipeline_parallel/shared_weights.h"
#include "parallel/process_group_manager.h"

namespace loom::parallel {

class FinalizeModelGrads {
 public:
  // Makes the tied embedding's copies equal (a broadcast from the first
  // stage, collective over the embedding group). Before the data-parallel
  // wrapper, which broadcasts over dp.
  FinalizeModelGrads(Model& model, ProcessGroupManager& pgm);

  // Steps 1-2, after forward_backward (which finished the dp sync).
  // Collective over the embedding group and tp; dp's buffers hold the gradients.
  void operator()(DataParallel* dp);

  // Params whose whole gradient step 1 reads: a ZeRO wrapper all-reduces
  // their buckets instead of reduce-scattering them.
  std::vector<Tensor> needs_whole_grad() const { return tied_embedding_.params(); }
  // Sequence parallelism's params with partial gradients (summed over tp in
  // step 2, or under ZeRO by the wrapper, before its reduce-scatter: sums_tp_partial_grads).
  std::vector<Tensor> tp_partial_grads() const { return sequence_parallel_partial_grads_.params(); }
  // Where the optimizer reduces the grad norm and found_inf (null: this rank alone).
  ProcessGroup* grad_stats_group(bool zero) const;
  // Model params left out of the grad norm: counted on another rank. zero: the
  // optimizer shards over dp (ZeRO), the experts over their expert-dp group.
  std::vector<Tensor> not_counted(bool zero = false) const;

 private:
  Model& model_;
  ProcessGroupManager& pgm_;
  SharedWeightGradHandler tied_embedding_;                  // over the embedding group
  SharedWeightGradHandler sequence_parallel_partial_grads_;  // over the tp group
};

}  // namespace loom::parallel
