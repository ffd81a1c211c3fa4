// DataParallelBucket: data parallelism whose gradient all-reduces overlap
// backward (picotron's DataParallelBucket; Megatron's DistributedDataParallel
// with overlap_grad_reduce; PyTorch DDP's reducer). A backward pass (bucket.h
// for the buffer):
//   1. A hook on each parameter's AccumulateGrad node adds .grad into the
//      param's fp32 main_grad (a view into the bucket buffer), drops .grad and
//      marks the param ready; the first hook of the pass queues a callback on
//      the autograd engine.
//   2. When every param of a bucket is ready, the bucket's all-reduce (average
//      over dp) is launched asynchronously; backward goes on with earlier layers.
//   3. The callback (or, under defer_grad_sync(), the caller: a pipeline
//      schedule after its last send_backward) waits for every bucket and hands
//      the average back as .grad: an fp32 param's .grad *is* its main_grad
//      (picotron's `param.grad = param.main_grad`), a bf16/fp16 param's a
//      rounded copy (a mixed-precision optimizer reads main_grad instead).
// ZeRO-1 and ZeRO-2 reduce-scatter the buckets instead (zero_data_parallel_bucket.h);
// expert parallelism's experts get a second buffer, over their expert-dp group (expert_buckets.h).
//
//   DataParallelBucket dp(model.named_parameters(), pgm.dp_group(), {.bucket_cap_mb = 25});
//   for (step...) {
//     for (micro-batches but the last) { auto guard = dp.no_sync(); backward(loss / K); }
//     backward(loss / K);   // syncs the sum of all micro-batches
//     optimizer.step();
//     dp.reset();           // zero main_grad, drop .grad: once per step
//   }
#pragma once

#include <vector>

#include "autograd/accumulate_grad.h"
#include "parallel/data_parallel/bucket.h"
#include "parallel/data_parallel/data_parallel_common.h"
#include "parallel/data_parallel/expert_buckets.h"

namespace loom::parallel {

struct BucketOptions {
  double bucket_cap_mb = 25.0;
  // Off when the optimizer reads main_grad itself (optim/mixed_precision_optimizer.h): no rounded bf16 .grad.
  bool grads_to_params = true;
};

class DataParallelBucket : public DataParallel {
 public:
  // Broadcasts the params from dp rank 0 (collective over dp_group), lays out the buffer (the
  // experts': expert_buckets.h), hooks every param that requires grad; destroying it unhooks them.
  // make: how each buffer is built (ZeroDataParallelBucket's reduce-scatter); unset, all-reduced.
  DataParallelBucket(const NamedParams& params, ProcessGroup& dp_group, BucketOptions options = {},
                     ExpertParams experts = {}, MakeBuckets make = {});

  // The fp32 gradient of param: a view into the bucket buffer.
  Tensor main_grad(const Tensor& param) const { return buffers_.of(param).main_grad(param); }
  // Step 3: waits for every bucket and hands the gradients over; a no-op when already done since reset().
  void finish_grad_sync() override;
  // Zeroes every main_grad and drops every .grad: once per optimizer step (Megatron's zero_grad_buffer).
  void reset();

  // What the training loop, finalize_model_grads and ZeRO ask of it (data_parallel_common.h).
  void zero_grad() override { reset(); }
  bool syncs_once_per_step() const override { return true; }
  Tensor grad_of(const Tensor& param) const override { return main_grad(param); }
  void grad_changed(const Tensor& param) override;  // hands main_grad over as .grad again (rounded: bf16/fp16)
  const BucketManager& bucket_manager() const { return *buffers_.dense; }
  bool kept_apart(const Tensor& param) const { return buffers_.kept_apart(param); }  // one of the experts
  const std::vector<Tensor>& params() const { return params_; }  // those that require grad

 protected:
  virtual void on_grad_accumulated(const Tensor& param);  // the AccumulateGrad hook

  BucketOptions options_;
  std::vector<Tensor> params_;
  GradBuffers buffers_;  // Megatron's buffers: the params' over dp, the experts' over expert-dp (expert_buckets.h)
  bool callback_queued_ = false;  // this backward's finish_grad_sync is queued
  bool synced_ = false;           // grads were synced and reset() has not run since
  std::vector<autograd::RemovableHandle> hooks_;  // each also keeps its AccumulateGrad alive (picotron's grad_accs)
};

}  // namespace loom::parallel
