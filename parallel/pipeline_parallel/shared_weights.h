// Weights shared across pipeline stages: the tied embedding. The GPT reads the
// token embedding wte on its first layer and multiplies by wteᵀ in its LM head
// on its last layer. Cut into stages, these live on different ranks, so the
// last stage holds its own copy of wte. The two copies are one weight: they
// start identical (a broadcast from the first stage at setup), each stage's
// backward gives its copy only *its* part of the gradient (the embedding
// lookup's, or the head's), and the true gradient is the sum of both. So after
// backward - and after the data-parallel sync, which averaged each copy over
// its own replicas - the two gradients are all-reduced (sum) over the
// embedding group {first stage, last stage}. Both copies then take the same
// optimizer step and stay bit-identical.
//
// ColossalAI's PipelineSharedModuleGradHandler, Megatron's
// _allreduce_embedding_grads over the embedding group. As in ColossalAI, the
// shared params are bucketed by (group, dtype) and each bucket's gradients are
// coalesced into one flat buffer: one all-reduce per bucket, not per tensor.
// With pp = 1 there is one wte and nothing to do (a group of size 1 is skipped),
// and so in a V (ZB-V, DualPipeV: both ends on stage 0, one tensor).
//
// The mechanism - copies of one weight whose gradients are summed over a
// group - serves one more case: under sequence parallelism the layernorms'
// gradients are partial sums over the tp group (finalize_model_grads.h keeps
// a second handler for them, under their own name).
#pragma once

#include <utility>
#include <vector>

#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/model_chunks.h"
#include "parallel/process_group_manager.h"

namespace loom::parallel {

class SharedWeightGradHandler {
 public:
  // param is this rank's copy of a weight shared over group; every member of
  // group registers its copy, in the same order.
  void add(const Tensor& param, ProcessGroup& group);
  bool empty() const { return shared_.empty(); }
  std::vector<Tensor> params() const;  // every registered copy, in order

  // Makes every copy equal to group rank 0's (at setup). Collective over each group.
  void broadcast_params();

  // Sums the copies' gradients over their groups, in place. Where the gradient
  // is depends on the data-parallel wrapper (dp->grad_of: .grad, or
  // DataParallelBucket's fp32 main_grad; .grad without a wrapper); what the
  // optimizer reads is refreshed afterwards (dp->grad_changed). Collective
  // over each group.
  void all_reduce_grads(DataParallel* dp = nullptr);

 private:
  std::vector<std::pair<Tensor, ProcessGroup*>> shared_;
};

// The GPT's tied embedding: the stage's wte on the first and the last stage,
// over pgm's embedding group; empty on middle stages and when pp = 1. Broadcasts
// the first stage's wte to the last stage (collective over the embedding group).
SharedWeightGradHandler tied_embedding_handler(ModelChunks& stage, ProcessGroupManager& pgm);

}  // namespace loom::parallel
