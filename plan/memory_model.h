// Per-rank memory of a planned run: parameters counted exactly as loom lays
// them out, bytes per parameter from loom's optimizer table, activations from
// Megatron's formula.
//
// Parameters on one rank (pipeline stage s, tp rank), V' = V padded to a
// multiple of tp (the vocab-parallel embedding's rows):
//   embedding  V' h / tp  +  s_max h              (wte split, wpe replicated)
//   block      (12 h^2 + 7 h) / tp  +  6 h        (qkv, proj, fc, fc-proj weights and the
//                                                  column-parallel biases split; 2 layernorms
//                                                  and 2 row-parallel biases replicated)
//   head       2 h  +  V' h / tp                  (ln_f; the tied wte again, unless this
//                                                  stage also holds the embedding)
// Stages own consecutive items of [embedding, block_0 .. block_{L-1}, head]
// cut by parallel::partition_uniform (train_gpt's default --partition) or
// partition_balanced; or, as Megatron-LM does, L / p blocks per stage with the
// embedding and head added to the first and last (Grid::partition).
// Check at tp 1, pp 1: V h + s h + L (12 h^2 + 13 h) + 2 h, nanoGPT's count.
//
// Bytes per parameter (optim::predict_memory, what --memory-report prints):
//   fp32: 4 params + 4 grads + 8 (m, v)                 (/dp for the optimizer under --zero)
//   bf16: 2 params + 4 grads (fp32 main_grad) + 12 (main, m, v)
// --zero 2 divides the grads by dp too and adds the two bucket-sized scratches
// they are reduced through (parallel/data_parallel/grad_shards.h): 2 x 4 B
// bytes, B the largest bucket - train_gpt's default 25 MiB of fp32, or the
// largest param if bigger (a bucket of its own: the embedding V' h / tp on a
// stage holding it, else the MLP's 4 h^2 / tp), at most the stage's params
// (then one bucket, one scratch). Under --ep the experts' buffer has scratches
// of its own (its largest param an expert's h I), its shards over expert-dp.
// --zero 3 (FSDP) divides the params by dp too, and adds the units gathered
// at once (parallel/data_parallel/fully_sharded.h): the embedding unit (its
// wte is read by the head, so it stays gathered) and the two largest
// neighbouring units after it (the one computing and the one prefetched), in
// the model dtype; pp is refused with it, as train_gpt refuses it.
// Hybrid sharding (--dp-shard, HSDP) divides all three by the shard group
// (dp_shard x cp) instead of dp x cp: the replicas hold the same shards.
// The gradient buffer's bucket padding (at most dp x 64 elements per bucket,
// parallel/data_parallel/bucket.h) is left out: < 0.1% for any real model.
//
// Activations per layer per micro-batch, 16-bit, with dropout (Korthikanti et
// al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// Table 2), in units of s b h bytes:
//   no tp          34 + 5 a s / h
//   tp t           10 + 24 / t + 5 a s / (h t)
//   tp t + SP      (34 + 5 a s / h) / t
//   full recompute 2 (the layer's input only; / t with SP)
//   selective      the same without 5 a s / (h t): the attention core's
//                  softmax, its dropout mask and output are rebuilt in backward
// A 1F1B stage holds min(m, p - stage) micro-batches in flight (stage 0: p),
// AFAB all m, interleaved 1F1B its warm-up forwards and the first backward's,
// over v chunks: ((p - stage - 1) 2 + (v - 1) p + 1) / v (stage 0: p (1 + (p -
// 1) / (p v)), Megatron's factor), optim::micro_batches_in_flight's count. The
// last stage also keeps the fp32 logits and their gradient, 2 x 4 s b V' / t.
// loom keeps fp32 activations (x 2) and has no dropout masks; the formula is
// Megatron's, scaled by the dtype only. Llama's blocks (ModelShape::llama) are
// counted by loom's own formula instead, optim::predict_activations' per_block
// (optim/activation_memory.h: RMSNorm's one statistic, RoPE's q and k, GQA's
// repeated k and v, SwiGLU's four tensors), the bytes --memory-report measures.
// Context parallelism (cp): a rank holds s / cp tokens of each sequence, so
// every term is the formula's at s / cp (the scores' 5 a s / h too: ring
// attention's blocks are (s / 2cp) x (s / 2cp)); the logits likewise. The
// params are the same on every cp rank; ZeRO shards over dp x cp, the group
// the gradients are averaged over.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/config.h"

namespace loom::plan {

// Parameters held by pipeline rank `stage` (one tp rank of it).
int64_t params_on_stage(const ModelShape& m, const Grid& g, int stage);
// Those of layer item i (0 embedding, 1..L blocks, L+1 head); has_embedding:
// the stage also holds item 0, so the head's tied wte is not counted again.
int64_t params_of_item(const ModelShape& m, const Grid& g, int64_t i, bool has_embedding);

// The layer items ([0] = embedding, 1..L = blocks, L+1 = head) on each
// pipeline rank, all chunks together.
std::vector<std::vector<int64_t>> items_on_stages(const ModelShape& m, const Grid& g);

struct RankMemory {
  int64_t num_params = 0;
  int64_t expert_params = 0;                      // of num_params, the routed experts' (plan/moe_model.h)
  int64_t params = 0, grads = 0, optimizer = 0;  // bytes
  int64_t gathered = 0;                           // bytes: ZeRO-3's units gathered at once
  double activations = 0;                         // bytes, peak in flight
  double total() const { return double(params + grads + optimizer + gathered) + activations; }
};

// Activation bytes of one transformer layer for one micro-batch.
double activation_bytes_per_layer(const ModelShape& m, const Grid& g, int64_t micro_batch);

// Micro-batches whose activations pipeline rank `stage` holds at its peak.
double micro_batches_in_flight(const Grid& g, int64_t micro_batches, int stage);

RankMemory memory_on_stage(const ModelShape& m, const Grid& g, const Batch& b, int stage);

}  // namespace loom::plan
