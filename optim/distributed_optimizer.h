// DistributedOptimizer: ZeRO stage 1 (Rajbhandari et al. 2020) in the shape of
// Megatron-LM's DistributedOptimizer. Each data-parallel rank keeps the
// optimizer state - fp32 main params, exp_avg, exp_avg_sq - of only 1/dp of the
// model, so optimizer memory per rank drops from 12 to 12/dp bytes per param
// (bf16 model; 8/dp for fp32, whose main params are the params themselves).
//
// The layout is DataParallelBucket's gradient buffer (parallel/data_parallel/bucket.h): each
// bucket, padded to a multiple of dp x 64, is cut into dp equal contiguous
// shards and rank r owns shard r of every bucket (one bucket: exactly the r-th
// 1/dp of the buffer). A shard may cut through a param. Ranges map a param to
// its owned part (Megatron's names):
//
//   buffer      | bucket 0 ........................| bucket 1 ....
//   shards      |  rank 0       |  rank 1          |
//   params      | c      | b            | pad      |
//   param b, on rank 0:  gbuf_world = [start of b, end of shard 0)   in the buffer
//                        gbuf_local = gbuf_world - start of shard 0  in this rank's shard
//                        param      = gbuf_world - start of b        within b (flattened)
//
// One step reads: layout -> reduce-scatter -> step the owned ranges -> all-gather.
//   layout          (once, here) the param buffer, the ranges this rank owns and
//                   an fp32 main param for each
//   reduce-scatter  during backward (ZeroDataParallelBucket, ReduceScatter):
//                   each bucket as soon as its last gradient arrives; rank r
//                   receives the average of its shard (ShardGrads mode, ZeRO-2:
//                   the same shards, and no whole buffer kept: grad_shards.h)
//   step            step(): unscale/clip over every shard of the model, AdamW on
//                   the owned ranges' main params, rounded into this rank's
//                   shard of the param buffer
//   all-gather      per bucket, async, while the next bucket is stepped; the
//                   params are views into the param buffer, so
//                   finish_param_sync() must run before the next forward -
//                   or, with overlap_param_gather(), each layer's forward
//                   pre-hook waits for its own buckets (param_gather_overlap.h)
// Without clipping and loss scaling the step starts earlier still, bucket by
// bucket inside backward: optim/zero_overlap.h.
// Expert parallelism's experts (the wrapper's params kept apart, in a buffer of
// their own reduce-scattered over their expert-dp group: data_parallel_bucket.h)
// are sharded the same way over that group, after the buckets: each rank keeps
// E / ep experts' state / (dp / ep), Megatron's expert-dp optimizer shards.
// Per rank, N dense and X expert params of one process, bf16 (fp32: 8, not 12):
//   dense    12 N / dp                      over dp (x cp)
//   experts  12 (X / ep) / (dp / ep) = 12 X / dp   over expert-dp (x cp)

#pragma once

#include <memory>
#include <vector>

#include "optim/mixed_precision_optimizer.h"
#include "optim/param_gather_overlap.h"
#include "optim/zero_overlap.h"
#include "parallel/data_parallel/zero_data_parallel_bucket.h"

namespace loom::optim {

// [start, end) in some index space.
struct Range {
  int64_t start = 0, end = 0;
  int64_t size() const { return end - start; }
};

// Where one param's owned part sits (all empty when this rank owns none of it).
struct ParamRange {
  Range gbuf_world;  // in the whole gradient buffer
  Range gbuf_local;  // in this rank's shard of the param's bucket
  Range param;       // within the param, flattened
};

// The part of a param at [param_start, param_start + numel) of the buffer that
// falls in the shard [shard.start, shard.end); empty ranges if none.
ParamRange param_range_in_shard(int64_t param_start, int64_t numel, Range shard);

// options with grad_stats_group defaulting to dp_group: under ZeRO each dp rank
// holds 1/dp of every gradient, so the norm and found_inf are sums over at least
// the dp group. Left per rank, ranks would clip by different factors, and a rank
// that alone finds an inf would skip its all-gathers while the others launch
// theirs (a hang). A pipeline passes the whole world. Used by ZeRO-1/2 (here)
// and ZeRO-3 (fully_sharded_optimizer.h).
MixedPrecisionOptions reduced_over_dp(MixedPrecisionOptions options, parallel::ProcessGroup& dp_group);

class DistributedOptimizer : public MixedPrecisionOptimizer {
 public:
  // groups: the model's params; dp: their ZeroDataParallelBucket (ZeRO-1 or
  // ZeRO-2). Moves every param into a param buffer laid out like the gradient
  // buffer (the params become views into it; values unchanged).
  // options.grad_stats_group defaults to dp's group (every shard of the model
  // once); with pipeline stages it must be the whole world.
  DistributedOptimizer(std::vector<ParamGroup> groups, parallel::ZeroDataParallelBucket& dp,
                       MixedPrecisionOptions options = {});
  ~DistributedOptimizer() override;

  // Unscale/clip over the whole world's shards, AdamW on this rank's shards,
  // launch the param all-gathers. Collective over the dp group and
  // grad_stats_group.
  StepResult step() override;
  // Waits for the param all-gathers of the last step (no-op when none are in
  // flight). Call before the params are read again: the next forward, an
  // evaluation, a checkpoint.
  void finish_param_sync() override;
  // Main params -> param buffer shard -> all-gather. Collective over dp.
  void refresh_model_params() override;

  // Megatron's overlap_param_gather: from now on the next forward waits for
  // each bucket's all-gather in the pre-hook of the first of `layers` (forward
  // order) that reads it, instead of finish_param_sync() waiting for all
  // before the forward (param_gather_overlap.h). Call once, before training.
  void overlap_param_gather(const std::vector<std::shared_ptr<nn::Layer>>& layers);
  void before_forward() override {
    if (!gather_overlap_) finish_param_sync();
  }
  bool overlaps_param_gather() const { return gather_overlap_ != nullptr; }
  // Waits for bucket b's all-gather if it is still in flight (a no-op after);
  // experts: a bucket of the experts' buffer.
  void wait_param_gather(int b, bool experts = false);
  // Bucket b's all-gather was launched and not yet waited for.
  bool param_gather_pending(int b, bool experts = false) const {
    return (experts ? experts_ : dense_).gathers.at(size_t(b)) != nullptr;
  }
  const parallel::BucketManager& bucket_manager() const { return dp_.bucket_manager(); }
  // The experts' buckets (--ep), sharded over expert-dp; null without.
  const parallel::BucketManager* expert_bucket_manager() const { return experts_.grads; }
  const std::vector<Tensor>& bucketed_params() const { return dp_.params(); }

  const std::vector<ParamRange>& ranges() const { return ranges_; }  // one per main param
  const Tensor& param_buffer() const override { return dense_.params; }
  const Tensor& expert_param_buffer() const { return experts_.params; }  // undefined without --ep
  parallel::ProcessGroup* shard_group() const override { return &dp_.dp_group(); }
  // True when buckets are stepped as their reduce-scatters finish (zero_overlap.h).
  bool steps_early() const { return overlap_ != nullptr; }

 private:
  friend class ZeroOverlap;  // steps buckets from the dp sync's end
  // One reduce-scattered gradient buffer and this optimizer's side of it: the
  // dense params' over dp, the experts' over their expert-dp group.
  struct Shards {
    parallel::ShardedBuckets* grads = nullptr;      // null: no such buffer (no experts kept apart)
    Tensor params;                                  // model dtype, grads' layout
    std::vector<std::vector<size_t>> bucket_mains;  // [bucket] -> main params in it
    std::vector<std::shared_ptr<parallel::Work>> gathers;  // [bucket] in-flight param all-gather
  };
  struct Layout;  // the param buffers, main params and ranges, built before the base class
  DistributedOptimizer(std::vector<ParamGroup> groups, parallel::ZeroDataParallelBucket& dp,
                       MixedPrecisionOptions options, Layout layout);
  static Layout build_layout(const std::vector<ParamGroup>& groups, parallel::ZeroDataParallelBucket& dp);
  // One buffer's part of the layout: its param buffer (the params become views of it), the ranges this
  // rank owns in bm's shards and a main param for each.
  static void lay_out(parallel::ShardedBuckets& bm, const std::vector<ParamGroup>& groups, Layout& layout,
                      Shards& shards);
  // AdamW on bucket b's owned ranges, rounded into the param buffer, then b's all-gather.
  void step_bucket(Shards& s, int b);
  void launch_all_gather(Shards& s, int b);

  parallel::ZeroDataParallelBucket& dp_;
  std::vector<ParamRange> ranges_;   // [main param]
  std::vector<Tensor> shard_grads_;  // [main param] fp32 view of its range in its bucket's shard_grad(b)
  Shards dense_;                     // over dp
  Shards experts_;                   // over expert-dp (--ep)
  Tensor main_grad(size_t i) const override { return shard_grads_[i]; }
  std::unique_ptr<ZeroOverlap> overlap_;           // when it applies (zero_overlap.h)
  std::unique_ptr<ParamGatherOverlap> gather_overlap_;  // overlap_param_gather() (param_gather_overlap.h)
};

}  // namespace loom::optim
