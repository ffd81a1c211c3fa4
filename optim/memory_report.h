// Where a rank's training memory goes, measured and predicted: params, the
// fp32 main_grad buffer and the optimizer state, counted through the counting
// allocator (tensor/storage.h) and printed next to the formula they should
// match (Megatron-LM's distributed-optimizer table; ZeRO paper, section 3);
// train_gpt's --memory-report. Per parameter on a rank holding N params, dp replicas:
//
//                        fp32 model         bf16/fp16 model
//   params               4                  2
//   grads (main_grad)    4                  4                 fp32 buffer, + bucket padding
//   optimizer state      8   (m, v)         12  (main, m, v)  divided by dp under --zero
//
// so bf16 with the distributed optimizer costs 6 + 12/dp bytes per param, and
// fp32 8 + 8/dp (an fp32 model's main params are the params themselves).
//
// ZeRO-2 (--zero 2) keeps only this rank's shards of the fp32 gradient plus the
// scratches buckets are reduced through (parallel/data_parallel/grad_shards.h):
//   grads = 4 (N + pad) / dp + 4 B min(2, buckets)   B: the largest bucket, padded
// so bf16 costs 2 + (4 + 12)/dp bytes per param plus the scratches: the
// Ultra-Scale Playbook's 2Ψ + (2Ψ + 12Ψ)/N with fp32 gradients (loom reduces
// in fp32, so 4Ψ where the playbook's bf16 grads have 2Ψ). The shards' padding
// is in the grads row (exact), not in comm.
//
// Two more rows:
//   comm buffers  what communication adds to the buffers above. loom reduces
//                 gradients in place in the main_grad buffer (the grads row is
//                 data parallelism's bucket buffer) and ZeRO all-gathers params
//                 in place in its param buffer (the params row), so the only
//                 persistent bytes that exist for communication's sake are the
//                 buckets' padding: each bucket of n_b elements is rounded up
//                 to a multiple of dp x 64 so that it splits into dp equal,
//                 aligned shards (parallel/data_parallel/bucket.h):
//                   pad = sum_b (ceil(n_b / (64 dp)) 64 dp - n_b) elements,
//                   x 4 bytes in the fp32 grad buffer, + x (2 or 4) in ZeRO's param buffer.
//                 Pipeline p2p receives and tp collectives allocate per call;
//                 what they receive is a stage input or a layer's activation,
//                 counted in the activation row. Exact.
//   activ. peak   optim/activation_memory.h's count, within its stated tolerance.
#pragma once

#include <string>
#include <vector>

#include "optim/mixed_precision_optimizer.h"
#include "parallel/data_parallel/zero_data_parallel_bucket.h"
#include "parallel/data_parallel/fully_sharded.h"

namespace loom::optim {

struct MemoryBreakdown {
  int64_t num_params = 0;        // parameters on this rank (its pipeline stage)
  int64_t params = 0;            // bytes of the model params (the param buffer under --zero)
  int64_t grads = 0;             // bytes of the fp32 main_grad buffer (or of the .grad tensors;
                                 // ZeRO-2: of the shards and the scratches; --ep: + the experts' own, alike)
  int64_t optimizer = 0;         // fp32 main params that are not the params themselves, exp_avg, exp_avg_sq, steps
  int64_t comm = 0;              // bucket padding of the grad buffers (+ ZeRO's param buffers; --ep: the experts' too)
  int64_t activations_peak = 0;  // peak bytes during step 1's forward + backward above what was live before it
  int64_t live = 0;              // all live bytes now
};

// Measures this rank's breakdown. dp may be null (no data-parallel wrapper); zero is dp
// under ZeRO-1/2 (its buckets reduce-scattered), else null.
MemoryBreakdown measure_memory(const std::vector<Tensor>& params, const parallel::DataParallelBucket* dp,
                               const parallel::ZeroDataParallelBucket* zero, const MixedPrecisionOptimizer& opt,
                               int64_t peak_during_step, int64_t live_before_step);

// What the table above predicts for this rank: {params, grads, optimizer} bytes
// (comm and activations are filled in by the caller, from the functions below).
struct MemoryPrediction {
  int64_t params, grads, optimizer;
  int64_t comm = 0;
  int64_t activations = 0;
};
// zero: the ZeRO stage (>= 1: optimizer state / dp; 2: grads 4 N / dp, without
// the scratches: predict_zero2_grad_bytes has them).
MemoryPrediction predict_memory(int64_t num_params, DType dtype, int dp, int zero);
// A mixture of experts (nn/moe.h): the routed experts' params are averaged and,
// under ZeRO, sharded over their expert-dp group, the dp / ep ranks that hold the
// same experts (Megatron's; plan/moe_model.h), the others over dp. ep: the
// expert-parallel ranks (1 until train_gpt --ep, whose rank holds E / ep experts).
MemoryPrediction predict_memory_moe(int64_t dense_params, int64_t expert_params, DType dtype, int dp, int ep,
                                    int zero);

// The buckets' padding in elements: params (element counts, module order)
// bucketed as BucketManager does - in reverse, a new bucket when the next
// param would pass cap_mb of fp32 - each bucket padded to a multiple of dp x 64.
int64_t predict_bucket_padding(const std::vector<int64_t>& numels, double cap_mb, int dp);
// The buckets' sizes in elements, padding included, bucket 0 first (same walk).
std::vector<int64_t> predict_bucket_numels(const std::vector<int64_t>& numels, double cap_mb, int dp);
// ZeRO-2's gradient bytes on a rank: its shards and the scratches (the formula above).
int64_t predict_zero2_grad_bytes(const std::vector<int64_t>& numels, double cap_mb, int dp);
// A rank's gradient buckets as DataParallelBucket lays them out: its params over
// dp (x cp) and, under --ep, the experts kept apart in buffers of their own over
// their expert-dp group (data_parallel_bucket.h), each padded, sharded under
// ZeRO-1/2 and given ZeRO-2's scratches alike (over expert-dp: dp / ep x cp).
struct BucketedParams {
  std::vector<int64_t> dense, experts;  // element counts, module order (experts: empty without --ep)
  double cap_mb = 25;
  int dp = 1, expert_dp = 1;
};
// The comm row: both grad buffers' padding x 4 (ZeRO-2: in the grads row
// instead), + x the model's bytes in both ZeRO param buffers.
int64_t predict_comm_bytes(const BucketedParams& b, DType dtype, int zero);
// ZeRO-2's grads row: each buffer's shards and its own scratches.
int64_t predict_zero2_grad_bytes(const BucketedParams& b);

// ZeRO-3 (parallel/data_parallel/fully_sharded.h): every row is a shard. Per
// unit u of N_u params, padded to P_u = ceil(N_u / dp) dp, with b bytes per
// model element (dp: the group the units are sharded over, dp x cp; with
// --dp-shard, hybrid sharding, dp-shard x cp - the replicas hold the same shards):
//   params      sum_u P_u / dp x b       the model-dtype shards
//   grads       sum_u P_u / dp x 4       the fp32 grad shards
//   optimizer   N / dp x (4 + 8)         main param (none for fp32) + moments, of this rank's owned elements
//   comm        the gathered working set, at its peak: the units held through
//               the step + the two largest adjacent units of the others (one
//               computing, the next prefetched): (held + max_l (P_l + P_l+1)) x b;
//               without prefetch (held + max_l P_l) x b, and without reshard
//               after forward every unit: sum_u P_u x b, as under ZB-H1, whose B
//               reshards none (W reduce-scatters them; measured = this on both
//               stages, dense and with experts). A pipeline's tied wte,
//               a unit of its own, counts with the layer that reads it. Held: the embedding
//               unit when the head reads its tied wte (its gradient is whole
//               only at the end of backward); under a pipeline the stage's last
//               unit when forwards run in a row (never resharded after forward,
//               it waits for its backward while the next micro-batch's forward
//               gathers the others). Interleaved, only the chunks that run while
//               it waits (zero3_chunks_beside_held) have their pairs beside it:
//               (P_first + max(max_l (P_l + P_l+1), P_last + max_l in those
//               chunks (P_l + P_l+1))) x b. At m = pp every forward comes first:
//               stage 0's first chunk runs all its forwards before the last
//               chunk's and all its backwards after them, so its own pair is its peak
MemoryBreakdown measure_memory_fully_sharded(const parallel::FullyShardedDataParallel& fsdp,
                                             const MixedPrecisionOptimizer& opt, int64_t peak_during_step,
                                             int64_t live_before_step);
// ZeRO-3's gathered working set at its peak, in elements (the comm row above),
// from the units' sizes in layer order: the report's prediction and the
// planner's (plan/memory_model.cpp) are this one function.
struct Zero3Units {
  std::vector<int64_t> numel;  // [unit] full params (padded to a multiple of dp, where known)
  std::vector<int> chunk;      // [unit] its model chunk (interleaved pipeline); empty: one chunk
  bool first_held = false;     // a later layer reads the first unit (the head's tied wte)
  bool last_held = false;      // forwards run in a row: the last unit waits gathered for its backward
  std::vector<bool> beside_held;  // [chunk] its units are gathered while the last unit waits; empty: every chunk's
  bool prefetch = true, reshard_after_forward = true;
  bool split_backward = false;  // ZB-H1: B reshards nothing (W's reduce-scatters do), so all are gathered at once
};
int64_t zero3_gathered_elements(const Zero3Units& u);
// Interleaved 1F1B (parallel/pipeline_parallel/interleaved_schedule.h), pp rank
// pp_rank of v chunks, m micro-batches: [chunk] whether a forward or backward of
// it runs while the rank's last unit waits, gathered, for its backward - from a
// forward of the last chunk (v - 1) to that chunk's next backward, which
// reshards it. pp 2, v 2, m 2, rank 0: F0.0 F1.0 F0.1 [F1.1] B0.1 B1.1 B0.0
// B1.0 -> {false, true}; m 4: F0.0 F1.0 F0.1 [F1.1 F2.0] B0.1 ... -> {true, true}.
std::vector<bool> zero3_chunks_beside_held(int pp, int pp_rank, int v, int micro_batches);

// beside_held: [chunk] whether its units are gathered while the stage's last
// unit, never resharded after forward, waits for its backward - every chunk when
// the stage runs two or more micro-batches' forwards before their backwards (a
// pipeline's warm-up, or AFAB), interleaved zero3_chunks_beside_held's; empty: never.
// split_backward: ZB-H1 (its B gathers every unit of the stage and reshards none).
MemoryPrediction predict_memory_fully_sharded(const parallel::FullyShardedDataParallel& fsdp, DType dtype,
                                              const std::vector<bool>& beside_held = {}, bool split_backward = false);

// One line per rank, gathered to world rank 0 (collective over world); returns
// the table on rank 0, "" elsewhere. json: also the same ledger as JSON (rank 0),
// {"ranks": [{"rank": 0, "num_params": N, "params": {"measured": B, "predicted": B},
// "grads": {...}, "optimizer": {...}, "comm": {...}, "activations": {...}, "live": B}, ...]}, in bytes.
std::string memory_report(const MemoryBreakdown& mine, const MemoryPrediction& predicted,
                          parallel::ProcessGroup& world, std::string* json = nullptr);

}  // namespace loom::optim
