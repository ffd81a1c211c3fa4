#include "parallel/data_parallel/data_parallel_bucket.h"

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "parallel/trace/trace.h"
#include "tensor/ops.h"

namespace loom::parallel {

DataParallelBucket::DataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, BucketOptions options,
                                       ExpertParams experts, MakeBuckets make)
    : options_(options) {
  if (!make)  // picotron's buckets, all-reduced (ZeroDataParallelBucket's are reduce-scattered)
    make = [cap = options.bucket_cap_mb](const std::vector<Tensor>& group_params, ProcessGroup& group) {
      return std::make_unique<BucketManager>(group_params, group, cap);
    };
  std::vector<Tensor> dense = unique_params(params);
  for (const Tensor& p : dense)
    if (autograd::requires_grad(p)) params_.push_back(p);
  // The experts leave `dense` for a buffer of their own, over their expert-dp group.
  buffers_.experts = take_expert_buckets(dense, experts, make);
  broadcast_params(dense, dp_group);  // every replica starts from dp rank 0's weights
  std::erase_if(dense, [](const Tensor& p) { return !autograd::requires_grad(p); });
  buffers_.dense = make(dense, dp_group);
  for (const Tensor& p : params_)
    hooks_.push_back(autograd::grad_accumulator(p)->register_hook([this](Tensor& g) { on_grad_accumulated(g); }));
}

void DataParallelBucket::on_grad_accumulated(const Tensor& param) {
  // After a sync an fp32 param's .grad *is* its main_grad: a backward now would add into the average.
  LOOM_CHECK(!synced_, "DataParallelBucket: backward after the gradients were synced, without reset() in between; "
             "call dp.reset() once per optimizer step (it zeroes main_grad and drops .grad)");
  BucketManager& buckets = buffers_.of(param);  // the dense params' or the experts' (expert_buckets.h)
  // 1. picotron: param.main_grad.add_(param.grad.data); param.grad = None.
  if (Tensor g = autograd::grad(param); g.defined()) ops::add_(buckets.main_grad(param), ops::to(g, kFloat32));
  autograd::set_grad(param, Tensor());
  if (!require_backward_grad_sync_) return;  // no_sync: just accumulate
  // 2. Once per backward, the callback that finishes it (unless defer_grad_sync() leaves that to the
  //    caller); the engine runs it before backward() returns, so `this` is still there.
  if (!callback_queued_ && finish_sync_in_backward_) {
    autograd::Engine::queue_callback([this] { finish_grad_sync(); });
    callback_queued_ = true;
  }
  // 3. The bucket's all-reduce starts once all its params are ready.
  buckets.mark_param_ready(param);
}

void DataParallelBucket::finish_grad_sync() {
  callback_queued_ = false;
  if (synced_) return;
  {
    trace::Span span("wait for gradient all-reduce");  // the exposed communication
    for (BucketManager* buffer : buffers_.all()) buffer->wait();
  }
  for (const Tensor& p : params_) grad_changed(p);  // picotron: param.grad = param.main_grad
  synced_ = true;
}

void DataParallelBucket::grad_changed(const Tensor& param) {
  if (!options_.grads_to_params) return;
  const Tensor g = main_grad(param);  // fp32: .grad *is* main_grad; else a rounded copy (picotron's main_grad.to)
  autograd::set_grad(param, param.dtype() == kFloat32 ? g : ops::to(g, param.dtype()));
}

void DataParallelBucket::reset() {
  for (BucketManager* buffer : buffers_.all()) buffer->reset();
  autograd::zero_grad(params_, /*set_to_none=*/true);
  callback_queued_ = false;
  synced_ = false;
}

}  // namespace loom::parallel
