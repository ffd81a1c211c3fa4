// Bucket and BucketManager: the gradient buffer of bucketed data parallelism
// (picotron's bucket.py; Megatron's _ParamAndGradBuffer and its buckets).
//
// Every gradient lives in one contiguous fp32 buffer, parameters in *reverse*
// order: backward produces the last layer's gradients first, so the buffer
// fills front to back and bucket 0 is complete first. A parameter's main_grad
// is a view into the buffer. The buffer is cut into buckets of at most
// bucket_cap_mb; the moment the last gradient of a bucket has arrived, the
// bucket's all-reduce is launched asynchronously while backward goes on with
// earlier layers. Communication overlaps compute, in a few large messages.
//
// Layout. Params a [100], b [3000], c [50] (module order), dp = 2, a cap of
// 1000 elements: reversed, c opens bucket 0; b would push it past the cap, so
// b opens bucket 1 (a param larger than the cap gets a bucket of its own); a
// would push bucket 1 past the cap and opens bucket 2:
//   buffer: | c 0..50  pad..128 | b 128..3128  pad..3200 | a 3200..3300  pad..3328 |
// Each bucket ends padded to a multiple of dp × 64 elements, so that ZeRO's
// reduce-scatter splits every bucket into dp equal shards, each starting
// 256-byte aligned (Megatron pads to lcm(dp, 128)). Padding stays zero.
// Here each bucket is all-reduced (DDP); ZeRO-1/2 reduce-scatter it (grad_shards.h).
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

constexpr int64_t kBucketPadElements = 64;  // per dp rank: 64 fp32 = 256 bytes

struct Bucket {
  int64_t offset = 0;          // first element in the buffer
  int64_t numel = 0;           // elements, padding included (a multiple of dp × 64)
  std::vector<Tensor> params;  // in buffer order (reverse module order)
  Tensor grad_data;            // [numel] fp32 view into the buffer (ZeRO-2: into a scratch, or undefined)
  std::vector<bool> ready;     // ready[i]: params[i]'s gradient is in for this backward
  int num_ready = 0;
  std::shared_ptr<Work> work;  // the in-flight all-reduce, once launched
  void reset_readiness() { work = nullptr; ready.assign(params.size(), false); num_ready = 0; }  // next backward
};

class BucketManager {
 public:
  // params: those that require grad, in module order. allocate false: a subclass allocates (grad_shards.h).
  BucketManager(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb, bool allocate = true);
  virtual ~BucketManager() = default;

  // p's gradient buffer: fp32, p's shape, a view into buffer().
  virtual Tensor main_grad(const Tensor& p) const { return slot(p).main_grad; }
  // p's gradient is in main_grad for this backward; if it completes its bucket,
  // launch the bucket's async reduction (the average over dp).
  void mark_param_ready(const Tensor& p);
  // After backward: launch any bucket not launched yet (its params got no gradient
  // this time, on every rank alike), then wait for each.
  void wait();
  // Zeroes the buffer and forgets readiness, for the next step (Megatron's zero_grad_buffer).
  void reset();
  // fn(b) runs as bucket b's reduction is launched, after those added before: the last moment its
  // gradients are whole (the experts' x 1 / ep, then sequence parallelism's sum over tp).
  void add_before_reduce(std::function<void(int bucket)> fn) { before_reduce_.push_back(std::move(fn)); }

  ProcessGroup& group() const { return group_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Tensor& buffer() const { return buffer_; }  // [sum of the stored buckets' numels] fp32
  int64_t numel() const { return buckets_.empty() ? 0 : buckets_.back().offset + buckets_.back().numel; }
  bool holds(const Tensor& p) const { return slots_.count(p.impl()) > 0; }
  int bucket_of(const Tensor& p) const { return slot(p).bucket; }
  int64_t offset_of(const Tensor& p) const { return slot(p).offset; }  // p's first element in the buffer

 protected:
  // Where p is: buckets_[bucket].params[index], elements [offset, offset + p.numel()) of the layout.
  struct Slot { int bucket, index; int64_t offset; Tensor main_grad; };
  const Slot& slot(const Tensor& p) const;
  // How bucket b's reduction is launched and waited for (ZeRO-1/2: a reduce-scatter).
  virtual std::shared_ptr<Work> launch_reduction(int b);
  virtual void wait_for(int b) { buckets_[size_t(b)].work->wait(); }
  void launch(Bucket& b);  // before_reduce, then launch_reduction

  ProcessGroup& group_;
  std::vector<Bucket> buckets_;
  Tensor buffer_;
  std::unordered_map<const TensorImpl*, Slot> slots_;
  Device device_;
  std::vector<std::function<void(int)>> before_reduce_;
};

}  // namespace loom::parallel
