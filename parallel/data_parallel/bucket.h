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
//
// Two ways to reduce a bucket:
//   AllReduce      every rank ends with the average of the whole bucket (DDP).
//   ReduceScatter  dp rank r ends with the average of shard r only, elements
//                  [r n/dp, (r+1) n/dp) of the bucket - all that ZeRO-1's
//                  distributed optimizer needs, for half the traffic of an
//                  all-reduce. The rest of the bucket keeps this rank's local
//                  sums: it is not a gradient any more.
// (ZeRO-2 keeps only the shards: GradShards, grad_shards.h, builds on this.)
// In ReduceScatter mode single buckets can still be all-reduced
// (all_reduce_bucket_of): a weight shared across pipeline stages needs its
// whole gradient on both stages, whose shards of it differ.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "parallel/comm/process_group.h"

namespace loom::parallel {

constexpr int64_t kBucketPadElements = 64;  // per dp rank: 64 fp32 = 256 bytes

struct Bucket {
  int64_t offset = 0;          // first element in the buffer
  int64_t numel = 0;           // elements, padding included (a multiple of dp × 64)
  std::vector<Tensor> params;  // in buffer order (reverse module order)
  Tensor grad_data;            // [numel] fp32 view into the buffer (ZeRO-2: into a scratch while
                               // backward fills it and its reduce-scatter runs, else undefined)
  Tensor shard_grad;           // [numel / dp] fp32: this rank's shard of the bucket's gradient
  std::vector<bool> ready;     // ready[i]: params[i]'s gradient is in for this backward
  int num_ready = 0;
  std::shared_ptr<Work> work;  // the in-flight all-reduce / reduce-scatter, once launched
  bool all_reduce = true;      // false: reduce-scatter into this rank's shard
};

// ShardGrads: ZeRO-2's GradShards (grad_shards.h; make_bucket_manager builds it).
enum class GradReduce { AllReduce, ReduceScatter, ShardGrads };

class BucketManager {
 public:
  // params: those that require grad, in module order.
  BucketManager(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb,
                GradReduce reduce = GradReduce::AllReduce)
      : BucketManager(params, dp_group, bucket_cap_mb, reduce, /*allocate_now=*/true) {
    LOOM_CHECK(reduce != GradReduce::ShardGrads, "BucketManager: ShardGrads is GradShards' mode (make_bucket_manager)");
  }
  virtual ~BucketManager() = default;

  // p's gradient buffer: fp32, p's shape, a view into buffer().
  virtual Tensor main_grad(const Tensor& p) const { return slot(p).main_grad; }
  // The main_grad a backward hook adds p's gradient into.
  virtual Tensor main_grad_to_fill(const Tensor& p) { return main_grad(p); }
  // p's gradient is in main_grad for this backward; if it completes its bucket,
  // launch the bucket's async all-reduce or reduce-scatter (average over dp).
  void mark_param_ready(const Tensor& p);
  // After backward: launch any bucket not launched yet (its params got no
  // gradient this time; the same on every rank, as the graph is), then wait
  // for every bucket's reduction; on_reduced(i), if given, runs as soon as
  // bucket i's is done, while later buckets may still be in flight.
  void wait(const std::function<void(int bucket)>& on_reduced = nullptr);
  // After a backward that does not sync (no_sync): nothing here (ZeRO-2 reduces its shards).
  virtual void finish_micro_batch() {}
  // This bucket is reduced in every backward, no_sync or not (ZeRO-2's).
  virtual bool reduces_every_micro_batch(const Tensor&) const { return false; }
  // Zeroes the buffer and forgets readiness, for the next step (Megatron's
  // zero_grad_buffer).
  void reset();

  // ReduceScatter mode: reduce p's whole bucket with an all-reduce instead
  // (before the first backward, and before fix_reductions()).
  void all_reduce_bucket_of(const Tensor& p);
  // From now on all_reduce_bucket_of() is an error naming `by`: a distributed
  // optimizer has planned its steps around how each bucket is reduced.
  void fix_reductions(std::string by) { fixed_by_ = std::move(by); }
  // fn(b) runs as bucket b's reduction is launched, before it reads the
  // gradients: the last moment they are whole on every rank
  // (DataParallelBucket sums sequence parallelism's partial ones over tp there).
  void set_before_reduce(std::function<void(int bucket)> fn) { before_reduce_ = std::move(fn); }

  // This rank's shard of bucket b: [offset, offset + numel) in the buffer, a
  // contiguous 1/dp of the bucket (the part a distributed optimizer owns).
  struct Shard {
    int64_t offset, numel;
  };
  Shard shard(int b) const;
  GradReduce reduce() const { return reduce_; }
  ProcessGroup& group() const { return group_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // [sum of the stored buckets' numels] fp32 (ZeRO-2 stores shards)
  const Tensor& buffer() const { return buffer_; }
  int64_t numel() const;  // elements of the layout: the sum of the buckets' numels, padding included
  // The scratches the buckets are reduced through (ZeRO-2's; empty here).
  virtual const std::vector<Tensor>& scratches() const;
  int bucket_of(const Tensor& p) const;
  int64_t offset_of(const Tensor& p) const;  // p's first element in the buffer

 protected:
  // allocate_now false: the subclass calls allocate() in its constructor.
  BucketManager(const std::vector<Tensor>& params, ProcessGroup& dp_group, double bucket_cap_mb, GradReduce reduce,
                bool allocate_now);
  struct Slot {
    int bucket;    // index into buckets_
    int index;     // position in the bucket's params
    int64_t offset;  // first element in the buffer
    Tensor main_grad;
  };
  const Slot& slot(const Tensor& p) const;
  // The buffer, each bucket's grad_data / shard_grad and the stored buckets' main_grads.
  void allocate();
  // What a subclass changes: which buckets are stored whole (else [numel / dp]),
  // a reduce-scatter's launch and wait, and a bucket changed to an all-reduce.
  virtual bool stores_whole(const Bucket&) const { return true; }
  virtual void launch_reduce_scatter(int b);
  virtual void wait_for(int b) { buckets_[size_t(b)].work->wait(); }
  virtual void bucket_now_all_reduced() {}

  void launch(Bucket& b);

  ProcessGroup& group_;
  std::vector<Bucket> buckets_;

 private:

  GradReduce reduce_;
  Tensor buffer_;
  std::unordered_map<const TensorImpl*, Slot> slots_;
  std::string fixed_by_;  // who fixed the buckets' reductions (fix_reductions), or empty
  std::function<void(int)> before_reduce_;
  Device device_;
};

}  // namespace loom::parallel
