// Sequence parallelism under ZeRO-1/2: the params whose gradient is each tp
// rank's partial sum over its T / tp tokens (layernorms, row-parallel biases;
// under --ep the routed experts too, whole on every tp rank, in their own
// buffer) are summed over tp as their bucket's reduction is launched, while the bucket
// is whole: after a reduce-scatter only shards are left, so finalize_model_grads
// could no longer sum them (FullyShardedOptions::tp_partial_grads does the same
// under ZeRO-3). The sum and dp's average commute.
#pragma once

#include <vector>

#include "parallel/data_parallel/bucket.h"

namespace loom::parallel {

// From now on, before each of buckets' reductions (after what was added there before, e.g. the
// experts' x 1 / ep, which commutes with it): the partial params' main_grads in that bucket, summed
// over tp_group in one coalesced all-reduce. The tp ranks' buckets hold the same params in the same order.
void sum_tp_partial_grads_before_reduce(BucketManager& buckets, std::vector<Tensor> partial, ProcessGroup& tp_group);

}  // namespace loom::parallel
