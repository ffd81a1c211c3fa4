// FullyShardedDataParallel: ZeRO-3 (Rajbhandari et al. 2020) in the shape of
// PyTorch's FSDP and torchtitan's FSDP2, built on loom's own hook points: the
// params themselves are sharded over dp, and a unit's full params exist only
// while that unit computes.
//
// Units: each layer of the model (the embedding, each block, the head) is one.
// A unit's params are flattened into one buffer padded to a multiple of dp
// (FSDP1's FlatParameter), and rank r keeps only shard r of it:
//
//   block 0, dp 2, params a [2, 3] and b [3] (9 elements, padded to 10)
//     full     | a0 a1 a2 a3 a4 | a5 b0 b1 b2 pad |   [10] model dtype, exists only while gathered
//     shards   | rank 0         | rank 1          |   [5] each, model dtype, always there
//     params   a = full[0:6] viewed [2, 3], b = full[6:9]: views of `full`, so
//              one all-gather into `full` fills every param of the unit, and
//              releasing its storage (tensor/storage.h) frees them all while
//              the Parameter tensors - which the graph, the optimizer and the
//              checkpoint hold - stay the same objects.
//
// One training step of unit l, and the hook that does each part:
//   forward pre-hook        unshard: wait for l's all-gather (the previous unit
//                           launched it), then prefetch l+1's (launch it async)
//   forward                 the params are plain views of the gathered buffer
//   forward hook            reshard: free l's buffer (reshard_after_forward; not
//                           the last layer, whose backward comes next); wrap the
//                           output in an identity whose backward unshards l
//   backward of that output unshard l (prefetched), prefetch l-1
//   post-accumulate-grad    once every param of l has its .grad: flatten them,
//                           (sequence parallelism: sum the layernorms' over tp),
//                           reduce-scatter (average over dp) into this rank's
//                           fp32 grad shard, drop the full grads, reshard l
//   end of backward         (Engine::queue_callback) wait for the last reduce-scatter
//   optimizer step          AdamW on the owned shards (optim/fully_sharded_optimizer.h)
//
// Memory per rank, Ψ params of the model in bf16 with Adam: (2 + 4 + 12) Ψ / dp
// for the param shard, the fp32 grad shard and the fp32 main param + moments,
// plus the working set: at most two units' full params in forward (the one
// computing and the one prefetched) and one unit's full gradient in backward.
// ZeRO-3 moves 1.5x the bytes of ZeRO-1 or plain dp: an all-gather in forward,
// another in backward, a reduce-scatter (plain dp: one all-reduce = both halves).
// An observer (fully_sharded_observer.h) hears when each layer computes and
// which unit each collective is for: with --trace, each layer's forward and
// backward become spans ("layer 2 forward") and each collective says its unit
// (fully_sharded_trace.h; docs/12-zero-2-and-3.md reads the bytes and the
// prefetch overlap off the timeline).
//
// Hybrid sharding (HSDP, FSDP2's and torchtitan's data_parallel_shard_degree x
// data_parallel_replicate_degree; options.replicate_group): dp_group is then
// one shard group of the dp ranks, and each of its shards has replicas in the
// other shard groups. Gathers and reduce-scatters stay inside the shard group;
// the reduce-scattered gradient shard is then averaged over the replicate
// group (an all-reduce of [full / shard] elements), so every replica steps the
// same shard on the whole dp's average. Memory: the shards are 1/shard, not
// 1/dp; traffic across shard groups: one all-reduce of the shards a step.
//
// Expert parallelism (options.experts): the experts a rank holds differ across
// its ep group, so they cannot share a unit with the dense params, cut over dp:
// each layer's experts form a unit cut over their expert-dp group (the dp / ep
// ranks holding them), gathered with the layer's unit and reduce-scattered over
// that group, times 1 / ep (ExpertParams::grad_scale) - per rank 1 / dp of one
// process's experts, as of every other param. Under HSDP that group is the
// expert-dp ranks inside this rank's shard group (the ep group lies inside it
// too), and the experts' grad shards are averaged over the replicate group as
// every other unit's: replicas hold the same experts at the same offsets.
//
// Tied weights: a param read by two layers belongs to the first layer's unit;
// the later layer gathers that unit too (the head reads wte, the embedding
// unit's). Gradient accumulation: every micro-batch reduce-scatters and adds
// into the grad shard (no_sync() changes nothing): no full gradient is ever
// kept, at the price of one reduce-scatter per micro-batch (PyTorch FSDP's
// no_sync keeps unsharded gradients instead, trading memory for traffic).
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"
#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/data_parallel/fully_sharded_observer.h"

namespace loom::parallel {

struct FullyShardedOptions {
  bool reshard_after_forward = true;  // false: keep each unit gathered from its forward to its backward (ZeRO-2-like params)
  bool prefetch = true;               // gather the next unit while this one computes
  // Sequence parallelism: the params whose gradient is each tp rank's partial
  // sum over its T / tp tokens (the layernorms'). Megatron sums them over tp
  // after the dp sync (finalize_model_grads.h); here no whole gradient is left
  // then, so the unit's hook sums them over tp_group before its reduce-scatter
  // (what torchtitan's DTensor does: a Partial gradient becomes Replicate first).
  std::vector<Tensor> tp_partial_grads;
  ProcessGroup* tp_group = nullptr;
  // An interleaved pipeline's model chunks: how many of the layers each holds,
  // in order (empty: one chunk). Prefetch stays inside a chunk: the next layer
  // in the list may be another chunk's, which runs micro-batches later.
  std::vector<size_t> chunk_sizes;
  // HSDP: the replicas of this rank's shards (null: dp_group is all of dp).
  ProcessGroup* replicate_group = nullptr;
  // Params that get a unit of their own, after the layers' units: a pipeline's
  // tied wte, whose copies on the first and the last stage must be cut at the
  // same offsets so that their grad shards can be summed over the embedding
  // group (grad_shard_of; finalize_model_grads.h). In its layer's unit wte
  // would sit beside wpe on one stage and after ln_f on the other.
  std::vector<Tensor> own_units;
  // Expert parallelism's experts (data_parallel_common.h): each layer's get a
  // unit of their own, after the others, sharded, gathered and reduce-scattered
  // over their expert-dp group, the gradient times grad_scale (1 / ep) before.
  ExpertParams experts;
  // Who watches the step (null: nobody); wrap.cpp passes --trace's.
  std::shared_ptr<FullyShardedObserver> observer;
};

class FullyShardedDataParallel : public DataParallel {
 public:
  struct Unit {
    std::vector<Tensor> params;    // the params this unit owns, in model order
    std::vector<int64_t> offsets;  // where each starts in the flat buffer
    int64_t numel = 0;             // sum of the params' numel
    ProcessGroup* group = nullptr;  // the ranks it is sharded over: dp_group, or the experts' expert-dp group
    Tensor full;                   // [numel padded to a multiple of dp] model dtype; released while sharded
    Tensor shard;                  // [full / dp] model dtype: this rank's part, always there
    Tensor grad_shard;             // [full / dp] fp32: dp average of this rank's part of the gradient
                                   // (dp: the shard group's size; HSDP averages over replicas too)
    std::shared_ptr<Work> gather;  // the all-gather in flight into `full`, or null
    bool gathered = false;         // `full` holds the params (its gather waited for)
    size_t grads_ready = 0;        // params whose .grad arrived in this backward
  };

  // Broadcasts the params from dp rank 0, shards every layer's unit and frees
  // the full params; hooks the layers and the params. Collective over dp_group.
  FullyShardedDataParallel(const std::vector<std::shared_ptr<nn::Layer>>& layers, ProcessGroup& dp_group,
                           FullyShardedOptions options = {});
  ~FullyShardedDataParallel() override;

  // DataParallel. Every backward reduce-scatters (see the top), so no_sync()
  // (DataParallel's) changes nothing here; zero_grad() zeroes the grad shards.
  void zero_grad() override;
  void finish_grad_sync() override;  // waits for the last reduce-scatter; resets the per-backward counts
  Tensor grad_of(const Tensor&) const override { return Tensor(); }  // no whole gradient exists
  bool holds_whole_grad(const Tensor&) const override { return false; }
  bool sums_tp_partial_grads() const override { return options_.tp_group != nullptr; }
  // options().own_units' params: their unit's grad shard (after finish_grad_sync).
  Tensor grad_shard_of(const Tensor& param) const override;

  // Every unit gathered, for code that reads the params outside forward (a
  // checkpoint, the sample); reshard_all() frees them again (the optimizer's
  // step does, since its update makes them stale).
  void unshard_all();
  void reshard_all();

  // Layer l's unit is units()[l]; options().own_units' follow, in their order, then the experts' units.
  const std::vector<Unit>& units() const { return units_; }
  // The units layer l gathers for its forward: its own, a tied weight's, an own unit's.
  const std::vector<size_t>& layer_units(size_t l) const { return layer_units_.at(l); }
  size_t num_layers() const { return layer_units_.size(); }
  // Whether a later layer reads unit u's params (the head, the embedding's tied
  // wte): u then stays gathered from its forward to that layer's backward.
  bool read_by_a_later_layer(size_t u) const;
  // The model chunk layer l belongs to (options().chunk_sizes; 0 without).
  size_t chunk_of(size_t l) const { return chunk_of_.at(l); }
  const FullyShardedOptions& options() const { return options_; }
  ProcessGroup& dp_group() { return dp_group_; }
  int dp_group_size() const { return dp_group_.size(); }
  // Bytes of full params materialized now (gathered or being gathered): the
  // working set; and its peak since construction (--memory-report).
  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }

 private:
  void unshard(size_t u);          // wait until unit u's params are gathered
  void prefetch(size_t u);         // launch unit u's all-gather if it is sharded
  void reshard(size_t u);          // free unit u's full params
  void before_forward(size_t layer);
  void after_forward(size_t layer, Tensor& output);
  void before_backward(size_t layer);
  void on_grad_accumulated(size_t u);
  void reduce_scatter_grad(size_t u);
  void sum_tp_partial_grads(const Unit& unit, const Tensor& full_grad);
  void finish_reduce_scatter();

  ProcessGroup& dp_group_;
  FullyShardedOptions options_;
  std::vector<Unit> units_;                       // [layer]: unit l is layer l's (empty if it owns nothing new), then own_units'
  std::vector<std::vector<size_t>> layer_units_;  // [layer] -> units it reads: its own, and a tied weight's
  struct ReduceScatter {
    std::shared_ptr<Work> work;
    Tensor full_grad, grad_out;  // [padded] and [padded / dp] fp32
    size_t unit = 0;
  } in_flight_;                  // at most one unit's reduce-scatter at a time
  int64_t peak_gathered_bytes_ = 0;
  bool callback_queued_ = false;
  std::vector<autograd::RemovableHandle> hooks_;  // forward pre-hooks, forward hooks, grad hooks
  std::shared_ptr<FullyShardedObserver> observer_;  // options_.observer, or one that watches nothing
  std::vector<size_t> chunk_of_;                  // [layer] -> its model chunk
};

}  // namespace loom::parallel
