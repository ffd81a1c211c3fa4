#include "parallel/pipeline_parallel/shared_weights.h"

#include <algorithm>

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

void SharedWeightGradHandler::add(const Tensor& param, ProcessGroup& group) {
  LOOM_CHECK(param.defined(), "SharedWeightGradHandler::add: undefined param");
  shared_.push_back({param, &group});
}

std::vector<Tensor> SharedWeightGradHandler::params() const {
  std::vector<Tensor> out;
  for (const auto& entry : shared_) out.push_back(entry.first);
  return out;
}

void SharedWeightGradHandler::broadcast_params() {
  std::vector<std::shared_ptr<Work>> works;
  for (auto& [p, group] : shared_)
    if (group->size() > 1) works.push_back(group->broadcast_async(p, /*root=*/0));
  for (auto& w : works) w->wait();
}

void SharedWeightGradHandler::all_reduce_grads(DataParallel* dp) {
  NoGradGuard no_grad;
  // The gradient tensor of each shared param: main_grad (bucketed dp) or .grad
  // (zeros if backward never reached it: the collective must still happen).
  std::vector<Tensor> grads;
  for (auto& [p, group] : shared_) {
    // Under ZeRO-1 the two stages' shards of the weight differ: its bucket
    // must be all-reduced, so that main_grad holds the whole averaged gradient.
    // ZeRO-3 cuts each copy alone (a unit of its own): shard r holds the same
    // elements on both stages, and the shards are summed instead.
    const bool whole = !dp || dp->holds_whole_grad(p);
    Tensor g = !dp ? autograd::grad(p) : whole ? dp->grad_of(p) : dp->grad_shard_of(p);
    LOOM_CHECK(whole || g.defined(), "SharedWeightGradHandler: shared weight ", p.describe(),
               " sits in a reduce-scattered bucket; call dp.sharded_buckets().all_reduce_bucket_of(weight) "
               "before training (ZeRO-3: give it a unit of its own, FullyShardedOptions::own_units)");
    if (!g.defined()) {
      g = zeros(p.shape(), p.dtype(), p.device());
      autograd::set_grad(p, g);
    }
    grads.push_back(g);
  }

  // 1. Buckets by (group, dtype), in the order they first appear (the same on
  //    every member, since every member registers its copies in the same order).
  struct Bucket {
    ProcessGroup* group;
    DType dtype;
    std::vector<size_t> members;  // indices into shared_
  };
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < shared_.size(); ++i) {
    ProcessGroup* group = shared_[i].second;
    if (group->size() == 1) continue;  // pp = 1: the only copy already has the whole gradient
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.group == group && b.dtype == grads[i].dtype();
    });
    if (it == buckets.end()) it = buckets.insert(buckets.end(), {group, grads[i].dtype(), {}});
    it->members.push_back(i);
  }

  // 2. Per bucket: flatten into one buffer, all-reduce (sum) it, copy back
  //    (torch's _flatten_dense_tensors / _unflatten_dense_tensors).
  for (const Bucket& b : buckets) {
    int64_t total = 0;
    for (size_t i : b.members) total += grads[i].numel();
    Tensor flat = loom::empty({total}, b.dtype, grads[b.members.front()].device());
    int64_t offset = 0;
    for (size_t i : b.members) {
      ops::copy_(ops::view(ops::narrow(flat, 0, offset, grads[i].numel()), grads[i].shape()), grads[i]);
      offset += grads[i].numel();
    }
    b.group->all_reduce(flat, ReduceOp::Sum);
    offset = 0;
    for (size_t i : b.members) {
      ops::copy_(grads[i], ops::view(ops::narrow(flat, 0, offset, grads[i].numel()), grads[i].shape()));
      offset += grads[i].numel();
      // The optimizer may read a copy (a half-precision param's rounded .grad
      // under bucketed dp): refresh it.
      if (dp) dp->grad_changed(shared_[i].first);
    }
  }
}

SharedWeightGradHandler tied_embedding_handler(ModelChunks& stage, ProcessGroupManager& pgm) {
  SharedWeightGradHandler handler;
  if (pgm.pp_size == 1 || !pgm.in_embedding_group()) return handler;
  if (!stage.embedding_weight().defined()) return handler;  // untied (Llama): nothing shared
  if (stage.is_first_stage() && stage.is_last_stage()) return handler;  // a V: both ends here, one tensor
  // The embedding group is [first stage, last stage]: group rank 0 is the first.
  handler.add(stage.embedding_weight(), pgm.embedding_group());
  handler.broadcast_params();
  return handler;
}

}  // namespace loom::parallel
