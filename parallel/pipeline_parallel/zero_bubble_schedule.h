// Zero-bubble pipeline schedules (Qi et al. 2024, "Zero Bubble Pipeline
// Parallelism", ICLR; PyTorch's ScheduleInterleavedZeroBubble and
// ScheduleZBVZeroBubble). A backward is two pieces of work (autograd/engine.h):
// B, the gradient of the stage's input, which the previous stage waits for,
// and W, the gradients of the stage's weights, which nobody waits for. 1F1B
// runs them as one; a zero-bubble schedule runs B as soon as it can and puts
// each W where 1F1B would sit idle.
//
// ZB-H1 (the paper's Figure 3, top; p 4, m 6; W<i>: the weights' half of B<i>'s backward):
//
//   stage 0 | F0 F1 F2 F3 .  .  .  B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5
//   stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 B4 W3 B5 W4 W5
//   stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5
//   stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5
//
// (1F1B, each backward two slots long there, idles (p - 1) 3 = 9 slots per stage.)
//
// Stage r runs 1F1B's p - r - 1 warm-up forwards, then, as 1F1B, one forward
// and one B at a time, with a W after each B - except after the first r B's,
// whose W's wait for the end of the step. B therefore travels up the pipeline
// at B's speed, not B + W's, and the W's left over fill the cool-down. With
// F, B and W of equal length the idle time per stage is (p - 1)(F + B - W)
// instead of 1F1B's (p - 1)(F + B + W): a third. A micro-batch's activations
// (and its W's X and dY) live from F to W, so stage r holds up to p of them,
// 1F1B's stage 0 peak, on every stage: the peak over stages is 1F1B's.
//
// Data parallelism: the hooks fire in W, so the gradients are synced in the
// last W, W<m-1> (every stage's last), and finished after the schedule.
#pragma once

#include <vector>

#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// ZB-H1's order on pp rank `pp_rank` of pp_size (see above). Errors: pp_size < 1,
// a rank outside it, no micro-batches.
std::vector<ScheduledOp> zb_h1_order(int pp_size, int pp_rank, int num_microbatches);

// Runs zb_h1_order on this rank. dp may be null.
ForwardBackwardResult train_step_pipeline_zb_h1(ModelChunks& stage, PipelineP2P& p2p,
                                                const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                                DataParallel* dp = nullptr);

}  // namespace loom::parallel
