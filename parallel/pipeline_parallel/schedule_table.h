// A schedule written as a table - each rank's list of F, B and W on
// (micro-batch, chunk) pairs, as the zero-bubble papers draw them - run on a
// stage of chunks: the one loop behind ZB-V (zbv_schedule.h) and DualPipeV
// (dualpipev_schedule.h). The table says what runs; the loop only moves the
// tensors: a forward receives its input from the chunk before (none on the
// model's first chunk) and sends its output on (none on the last, which keeps
// the loss); B receives its output gradient (none on the last chunk) and sends
// its input gradient back; W computes the weights' gradients B left
// (autograd/engine.h), with nothing to receive or send. Where the chunks sit
// - a ring or a V - is the links' business (pipeline_p2p.h).
//
// A full backward (DualPipeV's B that is not split) is a B with its W right
// after it: the same gradients, the same hooks at the same moment.
//
// Data parallelism, as in interleaved 1F1B (interleaved_schedule.h): a wrapper
// whose hooks reduce each gradient as it arrives syncs every chunk in that
// chunk's W of micro-batch m - 1; one that syncs once per step, in the rank's
// last W. Either way the hooks fire in W, never in B.
#pragma once

#include <vector>

#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// Runs orders[pp rank] (this rank's table; orders: every rank's, laid out as
// `layout`) on the stage. Each send is posted and held until the op of this
// rank's order by which it is known delivered (send_release.h): what a send
// holds is alive for a span of the schedule, the same on every run. Errors:
// an order without every (micro-batch, chunk)'s F, B and W exactly once.
// overlap_pairs: each F followed by a full backward on the other chunk runs
// with it at once (overlapped_pairs.h), else one after the other.
ForwardBackwardResult run_schedule_table(const std::vector<std::vector<ScheduledOp>>& orders, ChunkLayout layout,
                                         ModelChunks& stage, PipelineP2P& p2p,
                                         const std::vector<MicroBatch>& micro_batches, const LossFn& loss_fn,
                                         DataParallel* dp, bool overlap_pairs = false);

}  // namespace loom::parallel
