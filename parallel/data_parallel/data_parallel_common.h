// What both data-parallel wrappers (data_parallel_naive.h, data_parallel_bucket.h)
// do with the parameters they are given: take them as an ordered list (the
// order of Module::named_parameters(), which fixes the bucket layout), make
// every dp rank start from rank 0's values, and switch gradient sync off for
// gradient accumulation (no_sync).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::parallel {

// What Module::named_parameters() returns: ("blocks.0.attn.qkv.weight", tensor), ...
using NamedParams = std::vector<std::pair<std::string, Tensor>>;

// The tensors of `named`, in order, each once (a tied weight appears once).
std::vector<Tensor> unique_params(const NamedParams& named);
std::vector<Tensor> unique_params(const std::vector<Tensor>& params);

// Expert parallelism's second group of params (parallel/expert_parallel/expert_parallel.h,
// Megatron's expert_parallel_buffers): the experts this rank holds, replicated
// only over the expert-dp group (dp / ep ranks), which broadcasts and reduces
// them instead of dp. Each rank's expert gradient already sums the tokens of
// its ep group, so the average over expert-dp is scaled by grad_scale = 1 / ep:
// the expert then gets (1/dp) Σ over every rank's tokens, as one process's mean
// and as every other gradient (Megatron's expert_gradient_scaling_factor).
struct ExpertParams {
  std::vector<Tensor> params;
  ProcessGroup* group = nullptr;  // the expert-dp group; null: no params apart
  double grad_scale = 1.0;        // expert-dp / dp = 1 / ep
  bool holds(const Tensor& p) const;
};

// Every rank of `group` gets rank 0's values, so the replicas start identical
// whatever seed each rank initialised with (DDP does this at wrap time too).
void broadcast_params(const std::vector<Tensor>& params, ProcessGroup& group);

// Sums each tensor over group in place, as one all-reduce of them flattened
// together (torch's _flatten_dense_tensors, all-reduce, _unflatten): one
// collective for many small tensors (sequence parallelism's layernorm
// gradients). Every member passes the same shapes in the same order, one
// floating dtype. Collective over group; a no-op for an empty list.
void all_reduce_coalesced(const std::vector<Tensor>& tensors, ProcessGroup& group);

// While alive, backward accumulates gradients locally and does not sync them
// (DDP's no_sync()); the first backward after it syncs the accumulated sum.
//   { auto guard = dp.no_sync(); backward(loss_micro_0); }
//   backward(loss_micro_1);   // all-reduces the sum of both micro-batches
// (In general: a flag switched off while the guard lives; defer_grad_sync() below uses it too.)
class NoSyncGuard {
 public:
  explicit NoSyncGuard(bool& flag) : flag_(flag), prev_(flag) { flag_ = false; }
  ~NoSyncGuard() { flag_ = prev_; }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  bool& flag_;
  bool prev_;
};
using DeferSyncGuard = NoSyncGuard;

// What a training loop (train_gpt, the pipeline schedules) needs from either
// data-parallel wrapper, so it can be written once for both. A wrapper's hooks
// capture `this`: it is neither copied nor moved.
class DataParallel {
 public:
  DataParallel() = default;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  virtual ~DataParallel() = default;
  // Gradient accumulation: backward inside the guard does not sync; the hooks
  // only accumulate, locally (picotron's require_backward_grad_sync = False).
  [[nodiscard]] virtual NoSyncGuard no_sync() { return NoSyncGuard(require_backward_grad_sync_); }
  // Clears this step's gradients before the next step's first backward.
  virtual void zero_grad() = 0;

  // Where a synced backward's reductions are waited for. By default at the end
  // of that backward (an engine callback, as DDP does). A pipeline schedule
  // defers it for its last backward and calls finish_grad_sync() after its last
  // transfer (Megatron's finalize_model_grads): a stage then sends its last
  // gradient upstream without first waiting for its own dp reduction, which
  // stays in flight while the earlier stages finish their backwards.
  //   { auto defer = dp.defer_grad_sync(); backward(loss_last); }  // launches, does not wait
  //   send_backward(...);
  //   dp.finish_grad_sync();                                       // waits
  [[nodiscard]] virtual DeferSyncGuard defer_grad_sync() { return DeferSyncGuard(finish_sync_in_backward_); }
  // Waits for the deferred reductions. A no-op for a wrapper that finishes
  // every reduction inside its hooks (DataParallelNaive).
  virtual void finish_grad_sync() {}
  // True when the first synced backward of a step syncs every gradient of
  // the step at its end (DataParallelBucket waits for all its buckets then);
  // false when each gradient is reduced in the backward that produces it
  // (DataParallelNaive). The interleaved schedule picks its sync point by it.
  virtual bool syncs_once_per_step() const { return false; }

  // Where param's gradient is after backward: the fp32 main_grad buffer
  // (DataParallelBucket) or .grad (undefined if backward never reached it).
  virtual Tensor grad_of(const Tensor& param) const;
  // After a gradient was changed in place outside backward (the tied
  // embedding's sum over its group, finalize_model_grads.h): refreshes
  // what the optimizer reads, if it is a copy (a rounded .grad).
  virtual void grad_changed(const Tensor&) {}
  // Whether grad_of(param) holds the whole averaged gradient after the sync
  // (false for a ZeRO reduce-scattered bucket, where only this rank's shard does).
  virtual bool holds_whole_grad(const Tensor&) const { return true; }
  // Where holds_whole_grad(param) is false: this rank's shard of param's
  // averaged gradient when param is cut alone (ZeRO-3's own unit: the same
  // elements on every copy of it), else undefined.
  virtual Tensor grad_shard_of(const Tensor&) const { return Tensor(); }
  // Whether the wrapper itself sums sequence parallelism's partial gradients
  // over tp (ZeRO-3, before its reduce-scatter), so finalize_model_grads must not.
  virtual bool sums_tp_partial_grads() const { return false; }

 protected:
  bool require_backward_grad_sync_ = true;  // false while a NoSyncGuard lives
  bool finish_sync_in_backward_ = true;     // false while a DeferSyncGuard lives
};

}  // namespace loom::parallel
