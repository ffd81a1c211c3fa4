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
// Each bucket ends padded to a multiple of dp × 64 elements, so a later
// reduce-scatter (ZeRO-1, the distributed optimizer) splits every bucket - and
// so the whole buffer - into dp equal shards, each starting 256-byte aligned.
// (Megatron pads buckets to a multiple of lcm(dp, 128) for the same reason.)
// Padding stays zero and travels with the all-reduce.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "parallel/process_group.h"

namespace loom::parallel {

constexpr int64_t kBucketPadElements = 64;  // per dp rank: 64 fp32 = 256 bytes

struct Bucket {
  int64_t offset = 0;          // first element in the buffer
  int64_t numel = 0;           // elements, padding included (a multiple of dp × 64)
  std::vector<Tensor> params;  // in buffer order (reverse module order)
  Tensor grad_data;            // [numel] fp32 view into the buffer
  std::vector<bool> ready;     // ready[i]: params[i]'s gradient is in for this backward
  int num_ready = 0;
  std::shared_ptr<Work> work;  // the in-flight all-reduce, once launched
};

class BucketManager {
 public:
  // params: those that require grad, in module order.
  BucketManager(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb);

  // p's gradient buffer: fp32, p's shape, a view into buffer().
  const Tensor& main_grad(const Tensor& p) const;
  // p's gradient is in main_grad for this backward; if it completes its bucket,
  // launch the bucket's async all-reduce (average over dp).
  void mark_param_ready(const Tensor& p);
  // After backward: launch any bucket not launched yet (its params got no
  // gradient this time; the same on every rank, as the graph is), then wait
  // for every bucket's all-reduce.
  void wait();
  // Zeroes the buffer and forgets readiness, for the next step (Megatron's
  // zero_grad_buffer).
  void reset();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Tensor& buffer() const { return buffer_; }  // [sum of bucket numels] fp32
  int bucket_of(const Tensor& p) const;

 private:
  struct Slot {
    int bucket;    // index into buckets_
    int index;     // position in the bucket's params
    Tensor main_grad;
  };
  const Slot& slot(const Tensor& p) const;
  void launch(Bucket& b);

  ProcessGroup& group_;
  Tensor buffer_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const TensorImpl*, Slot> slots_;
};

}  // namespace loom::parallel
