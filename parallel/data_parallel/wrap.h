// Which data-parallel wrapper a model gets, decided in one place (Megatron
// always wraps in DDP). Gradients accumulate in DataParallelBucket's fp32
// main_grad buffer whenever there is more than one replica, the model is not
// fp32 (bf16 sums lose bits), or the optimizer is sharded (ZeRO-1 shards that
// buffer) - on a single process too, as a dp group of one. mode "naive"
// (DataParallelNaive: a hook per gradient, no buffer) serves only fp32
// replicas without ZeRO; an fp32 single process gets no wrapper at all
// (plain .grad tensors). ZeRO-3 (zero = 3) is FullyShardedDataParallel over
// the model's layers: it shards the params themselves, on one process too.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "parallel/model_chunks.h"
#include "parallel/data_parallel/fully_sharded.h"
#include "parallel/data_parallel/zero_data_parallel_bucket.h"

namespace loom::parallel {

struct DataParallelOptions {
  std::string mode = "bucket";  // "bucket" or "naive"
  double bucket_mb = 25;        // MiB of fp32 gradients per bucket (PyTorch DDP's default)
  DType dtype = kFloat32;       // the model's params
  int zero = 0;                 // ZeRO stage: >= 1 the optimizer shards the buffer (reduce-scatter:
                                // ZeroDataParallelBucket); 2: only the shards are kept (GradShards);
                                // 3: the params are sharded too (FullyShardedDataParallel)
  FullyShardedOptions fsdp;     // zero = 3: prefetch, reshard after forward
  // Sequence parallelism's params with partial gradients over tp_group
  // (FinalizeModelGrads::tp_partial_grads). Under ZeRO the wrapper sums them
  // before its reduce-scatter; without ZeRO finalize_model_grads does, after the sync.
  std::vector<Tensor> tp_partial_grads;
  ProcessGroup* tp_group = nullptr;
  // zero = 3 with HSDP: dp_group is one shard group; these are its shards' replicas (fully_sharded.h).
  ProcessGroup* replicate_group = nullptr;
  // Expert parallelism: the experts, reduced over the expert-dp group (data_parallel_common.h);
  // bucketed (under ZeRO-1/2 reduce-scattered and sharded over expert-dp) or naive DP, not ZeRO-3.
  ExpertParams experts;
};

struct DataParallelWrap {
  std::unique_ptr<DataParallel> dp;  // null: one fp32 process, plain .grad tensors
  DataParallelBucket* bucket = nullptr;  // == dp when it holds the main_grad buffer
  ZeroDataParallelBucket* zero = nullptr;  // == dp under ZeRO-1/2 (its buckets reduce-scattered)
  FullyShardedDataParallel* fsdp = nullptr;  // == dp under ZeRO-3
  // At the top of a step: the wrapper's zero_grad, or the params' .grad dropped.
  void zero_grad(nn::Module& model);
  // A test aid (train_gpt's --inject-overflow): the first fp32 element this
  // rank stores of the last param's gradient - its main_grad, under ZeRO-2
  // this rank's shard of its bucket, under ZeRO-3 the last unit's grad shard.
  // Errors without a main_grad buffer.
  Tensor last_grad_element() const;
};

// Collective over dp_group (the params broadcast from dp rank 0). whole_grad:
// params whose bucket stays all-reduced under ZeRO (the tied embedding:
// FinalizeModelGrads::needs_whole_grad). Errors: naive with a buffer needed.
DataParallelWrap wrap_data_parallel(ModelChunks& model, ProcessGroup& dp_group, const DataParallelOptions& options,
                                    const std::vector<Tensor>& whole_grad = {});

}  // namespace loom::parallel
