#include "parallel/data_parallel/wrap.h"

#include "autograd/variable.h"
#include "tensor/ops.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "parallel/data_parallel/fully_sharded_trace.h"

namespace loom::parallel {

void DataParallelWrap::zero_grad(nn::Module& model) {
  if (dp) dp->zero_grad();
  else autograd::zero_grad(model.parameters(), /*set_to_none=*/true);
}

DataParallelWrap wrap_data_parallel(ModelChunks& model, ProcessGroup& dp_group, const DataParallelOptions& o,
                                    const std::vector<Tensor>& whole_grad) {
  if (o.zero == 3) {  // ZeRO-3: the params sharded by layer (fully_sharded.h)
    LOOM_CHECK(o.mode == "bucket", "--dp-mode naive all-reduces whole gradients; --zero 3 reduce-scatters them");
    DataParallelWrap w;
    FullyShardedOptions fo = o.fsdp;
    if (o.tp_group) fo.tp_partial_grads = o.tp_partial_grads, fo.tp_group = o.tp_group;  // summed before its reduce-scatter
    fo.replicate_group = o.replicate_group;
    fo.experts = o.experts;  // --ep: each layer's experts a unit over their expert-dp group
    fo.own_units = whole_grad;  // the pipeline's tied wte: cut alone, its grad shards summed over the embedding group
    for (const LayerRange& r : model.chunks()) fo.chunk_sizes.push_back(size_t(r.end - r.start));
    if (trace::enabled()) fo.observer = std::make_shared<FullyShardedTrace>(model.layers().size());  // --trace
    auto fsdp = std::make_unique<FullyShardedDataParallel>(model.layers(), dp_group, fo);
    w.fsdp = fsdp.get();
    w.dp = std::move(fsdp);
    return w;
  }
  LOOM_CHECK(!o.replicate_group, "wrap_data_parallel: hybrid sharding (a replicate group) is ZeRO-3's; got zero ", o.zero);
  const bool fp32 = o.dtype == kFloat32;
  const bool use_buffer = dp_group.size() > 1 || !fp32 || o.zero >= 1;
  LOOM_CHECK(!use_buffer || o.mode == "bucket" || (dp_group.size() > 1 && fp32 && o.zero == 0),
             "--dp-mode naive has no fp32 main_grad buffer; --dtype ", dtype_name(o.dtype),
             o.zero >= 1 ? str(" --zero ", o.zero) : "", " needs --dp-mode bucket");
  DataParallelWrap w;
  if (use_buffer && o.mode == "naive") {
    w.dp = std::make_unique<DataParallelNaive>(model.named_parameters(), dp_group, o.experts);
  } else if (o.zero >= 1) {  // ZeRO-1/2: the buckets reduce-scattered for a DistributedOptimizer
    const GradReduce reduce = o.zero >= 2 ? GradReduce::ShardGrads : GradReduce::ReduceScatter;
    auto zero = std::make_unique<ZeroDataParallelBucket>(model.named_parameters(), dp_group, reduce, o.bucket_mb,
                                                         o.experts);
    // These buckets are still all-reduced: finalize_model_grads needs their whole gradient.
    for (const Tensor& p : whole_grad) zero->sharded_buckets().all_reduce_bucket_of(p);
    // Sequence parallelism's partial gradients are summed over tp before the
    // reduce-scatter, while they are whole (after it only shards are left).
    if (o.tp_group && !o.tp_partial_grads.empty())
      zero->sum_tp_partial_grads_before_reduce(o.tp_partial_grads, *o.tp_group);
    w.bucket = w.zero = zero.get();
    w.dp = std::move(zero);
  } else if (use_buffer) {
    BucketOptions bo{o.bucket_mb, /*grads_to_params=*/false};  // the optimizer reads main_grad
    auto bucketed = std::make_unique<DataParallelBucket>(model.named_parameters(), dp_group, bo, o.experts);
    w.bucket = bucketed.get();
    w.dp = std::move(bucketed);
  }
  return w;
}

Tensor DataParallelWrap::last_grad_element() const {
  if (fsdp) return ops::narrow(fsdp->units().back().grad_shard, 0, 0, 1);
  LOOM_CHECK(bucket, "--inject-overflow needs the main_grad buffer (--dtype fp16/bf16 or --zero)");
  const Tensor& p = bucket->params().back();
  const BucketManager& bm = bucket->bucket_manager();
  const int last = bm.bucket_of(p);
  // ZeRO-2 keeps no whole gradient, only this rank's shard of p's bucket (which the reduce-scatters add into).
  if (!bm.buckets()[size_t(last)].grad_data.defined())
    return ops::narrow(zero->sharded_buckets().shard_grad(last), 0, 0, 1);
  return ops::narrow(ops::view(bucket->main_grad(p), {p.numel()}), 0, 0, 1);
}

}  // namespace loom::parallel
