// ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR, section 6;
// PyTorch's ScheduleZBVZeroBubble). Each of the p ranks holds two chunks in a
// V (ChunkLayout::V, partition.h): rank r holds virtual stages r and
// 2p - 1 - r, so a micro-batch goes down the ranks on chunk 0 and back up on
// chunk 1, and the first and last layer both sit on rank 0. With F, B and W
// of equal length on a chunk, rank r starts r slots late and the V drains as
// it filled: p - 1 idle chunk slots per rank against 6 m busy, a bubble of
// (p - 1)/(6 m + p - 1), half of ZB-H1's idle time (a chunk is half a
// stage). A rank holds up to 2p chunk-micro-batches (from F to W): p stages'
// worth, 1F1B's first stage's peak, on every rank.
//
// The table (F<i>.<c>: forward of micro-batch i on chunk c; B, W: its input
// and weight gradients; pp 2, m 4; stage 1 turns the V):
//
//   stage 0 | F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0 F3.1 B3.1 W3.1 B2.0 W2.0 B3.0 W3.0 .
//   stage 1 | .    F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 F3.0 B1.0 W1.0 F3.1 B2.1 W2.1 B2.0 B3.1 B3.0 W2.0 W3.1 W3.0
//
// Rank r's order, as PyTorch writes it:
//   warm-up   2(p - r) - 1 forwards on chunk 0; r pairs (F on chunk 1, F on chunk 0);
//             p - r triples (F, B, W on chunk 1)
//   steady    (F, B, W on chunk 0) then (F, B, W on chunk 1), until every forward has run
//   cool-down r pairs (B on chunk 0, B on chunk 1); p - r (B, W on chunk 0); the W's left
// written for max(m, 2p - 1) micro-batches, the ones past m dropped (their
// slots idle). With m < 2p - 1 the V is never full.
#pragma once

#include <vector>

#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// ZB-V's order on pp rank `pp_rank` of pp_size. Errors: pp_size < 2, a rank
// outside it, no micro-batches.
std::vector<ScheduledOp> zb_v_order(int pp_size, int pp_rank, int num_microbatches);

// Runs zb_v_order on a stage of two chunks laid out in a V. dp may be null.
ForwardBackwardResult train_step_pipeline_zb_v(ModelChunks& stage, PipelineP2P& p2p,
                                               const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                               DataParallel* dp = nullptr);

}  // namespace loom::parallel
