// Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language
// Model Training on GPU Clusters"; Megatron-LM's
// forward_backward_pipelining_with_interleaving). Each of the p ranks holds v
// model chunks (virtual stages, partition.h): rank r holds chunks r, r + p,
// r + 2p, ... of the p v chunks, so a micro-batch goes round the ring of ranks
// v times. A rank can then start its next forward after 1/v of a stage's work
// instead of a whole stage's: the pipeline fills and drains v times faster,
// and the bubble shrinks from (p - 1)/m to (p - 1)/(v m) of the compute, for
// v times as many transfers.
//
// The order. A rank runs m v forwards and m v backwards, each on a (micro-
// batch, chunk) pair. The k-th forward is Megatron's get_model_chunk_id: in
// groups of p micro-batches, chunk 0 for all of the group, then chunk 1, ...
//   k -> chunk (k mod p v) / p,  micro-batch (k / p v) p + k mod p
// and the k-th backward the same with the chunks reversed (v - 1 - chunk).
// With pp 2, v 2, m 4 the forwards are F0.0 F1.0 F0.1 F1.1 F2.0 F3.0 F2.1 F3.1.
// Rank r first runs (p - r - 1) 2 + (v - 1) p warm-up forwards (all m v when
// m = p), then alternates one forward and one backward (steady 1F1B), then
// the remaining backwards (cool-down):
//
//   pp 2, v 2, m 4 (rank 0: 4 warm-up forwards, rank 1: 2)
//   rank 0 | F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0
//   rank 1 | F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0
//
// The groups of p micro-batches are why Megatron requires m to be a multiple
// of p; so does loom.
//
// Transfers. The output of chunk c on rank p - 1 is the input of chunk c + 1
// on rank 0: the p2p links form a ring (pipeline_p2p.h's recv_activation /
// send_gradient, ...). Megatron posts each step's sends and receives together
// in lock-step; here, as in every schedule, a send returns without waiting
// for its receiver and each direction of each link is its own channel, so a
// rank simply receives each input right before the forward or backward that
// needs it. The order of each link's messages is the same on both ends (the
// forwards' order restricted to the chunks that send), which is all the
// channels need.
//
// Data parallelism: a wrapper whose hooks reduce each gradient as it arrives
// (DataParallelNaive) syncs every chunk's parameters in that chunk's last
// backward (micro-batch m - 1), Megatron's per-chunk rule. One that syncs
// once per step (DataParallelBucket: it waits for all its buckets at the end
// of the backward that first syncs; syncs_once_per_step()) syncs in the rank's
// last backward alone (B(m-1).0), and launches the buckets no backward
// completed then.
#pragma once

#include <vector>

#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// Megatron's order for pp rank `pp_rank` (see above). Errors: pp_size < 2,
// num_chunks < 1, num_microbatches not a positive multiple of pp_size.
std::vector<ScheduledOp> interleaved_order(int pp_size, int pp_rank, int num_chunks, int num_microbatches);

// The interleaved schedule on a stage of stage.num_chunks() chunks, laid out
// as partition_*(..., pp_size, v) lays them out. dp may be null.
ForwardBackwardResult train_step_pipeline_interleaved(ModelChunks& stage, PipelineP2P& p2p,
                                                      const std::vector<MicroBatch>& micro_batches,
                                                      const LossFn& loss_fn, DataParallel* dp = nullptr);

}  // namespace loom::parallel
