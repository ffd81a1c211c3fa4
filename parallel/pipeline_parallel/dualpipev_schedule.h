// DualPipeV (DeepSeek-AI 2024, the V-shaped cut of DualPipe from the
// DeepSeek-V3 report, arXiv 2412.19437, and deepseek-ai/DualPipe; PyTorch's
// ScheduleDualPipeV). The V of ZB-V (zbv_schedule.h): rank r holds virtual
// stages r and 2p - 1 - r. Its steady state pairs the forward of one
// micro-batch on one chunk with the full backward of another micro-batch on
// the other chunk - F0 with B1, then F1 with B0 - so that on a GPU the pair's
// computation hides the other's communication (DeepSeek overlaps the
// expert all-to-all of one with the attention and MLP of the other). The
// backward is split into B and W only where that fills a bubble: at the turn
// of the V (step 3) and in the cool-down (steps 6 to 8), where each W runs
// from a queue of the B's that left one.
//
// Rank r's steps (DualPipe's names; "F0": a forward on chunk 0, "B1W1": a
// full backward on chunk 1, "F0+B1W1": an overlapped pair):
//   1  F0                        2 (p - r - 1) times
//   2  F0 F1                     r + 1 times
//   3  B1 W F1                   p - r - 1 times (W: the oldest queued, if any)
//   4  F0+B1W1, F1+B0W0          m - 2p + r + 1 times (DeepSeek runs rank p - 1's first pair in turn;
//                                --overlap-pairs overlaps every pair that cannot stall: overlapped_pairs.h)
//   5  B1W1, F1+B0W0             p - r - 1 times
//   6  B1 B0                     r + 1 times, full until half-way, then split
//   7  W B0                      p - r - 1 times
//   8  W                         r + 1 times
// The table (pp 2, m 4; a pair is two cells in a row, F then B W):
//
//   stage 0 | F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 B1.1 W1.1 F2.1 B0.0 W0.0 B2.1 W2.1 F3.1 B1.0 W1.0 B3.1 W3.1 B2.0 W2.0 .    B3.0 W3.0
//   stage 1 | .    F0.0 F0.1 F1.0 F1.1 F2.0 B0.1 W0.1 F2.1 B0.0 W0.0 F3.0 B1.1 W1.1 F3.1 B1.0 W1.0 B2.1 W2.1 B2.0 W2.0 B3.1 B3.0 W3.1 W3.0
//
// With F, B and W of equal length on a chunk its bubble is ZB-V's,
// (p - 1)/(6 m + p - 1); it holds one chunk-micro-batch more, 2p + 1.
//
// By default the two halves of a pair run one after the other (F, then B and
// its W); with overlap_pairs (--overlap-pairs) at once, on two threads, with
// DeepSeek's order of receives and sends (overlapped_pairs.h). Needs m >= 2p.
#pragma once

#include <vector>

#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// DualPipeV's order on pp rank `pp_rank` of pp_size, a full backward written
// as B then W. Errors: pp_size < 2, a rank outside it, fewer than 2 pp_size micro-batches.
std::vector<ScheduledOp> dualpipev_order(int pp_size, int pp_rank, int num_microbatches);

// Runs dualpipev_order on a stage of two chunks laid out in a V. dp may be
// null. overlap_pairs: the pairs' halves compute at once (overlapped_pairs.h).
ForwardBackwardResult train_step_pipeline_dualpipev(ModelChunks& stage, PipelineP2P& p2p,
                                                    const std::vector<MicroBatch>& micro_batches,
                                                    const LossFn& loss_fn, DataParallel* dp = nullptr,
                                                    bool overlap_pairs = false);

}  // namespace loom::parallel
