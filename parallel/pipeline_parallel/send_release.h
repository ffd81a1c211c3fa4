// When a zero-bubble schedule (schedule_table.h, zero_bubble_schedule.cpp)
// lets go of each send: at the first op of its own order by which the sender
// knows the receiver has the tensor.
//
// A send is an isend: its payload (and, the first time on a channel, its
// 80-byte header) must stay alive until MPI is done with it, and a tensor
// freed "once the send completes" is freed at a moment of timing - whenever
// the sender next happens to test it. Here the moment is the schedule's: the
// sender waits for the send at the start of op k, the first op whose input
// came (through any chain of messages) from the receiver after the receiver
// began the op that takes the tensor. By then the receive is done, so the
// wait returns without waiting on the other rank: it costs no time, and what
// the send holds is alive from its op to op k, on every run.
//
// An activation is always known delivered by the B of its micro-batch and
// chunk (its gradient came back from the receiver), while the activation is
// still kept for that B: its send changes no peak. An input gradient, sent by
// B and held with the stage's input until W (optim/split_backward.h), may be
// known delivered only after W: between W and op k it is the send's alone -
// the term optim/activation_memory.h's walk counts.
//
// Found with vector clocks over all ranks' orders: at the start of each op,
// the last op of every rank it has heard of (Lamport 1978; Mattern 1988).
#pragma once

#include <vector>

#include "parallel/pipeline_parallel/partition.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::parallel {

// A channel's header, [ndim, dtype, 8 dims] int64 (pipeline_channels.cpp): it
// goes with the first send on each link of a schedule, and lives as long.
constexpr double kSendHeaderBytes = 80;

// A link's far end, for op `kind` (F, B, W) on chunk c of stage s of p: the
// stage it sends its output to / receives its input from, and the chunk
// there; stage -1 when nothing crosses a link (W, the pipeline's ends, the V's
// turn in memory).
struct Link {
  int stage = -1, chunk = 0;
};
Link sends_to(char kind, int s, int c, int p, ChunkLayout layout);
Link receives_from(char kind, int s, int c, int p, ChunkLayout layout);

// orders: every rank's order (rank r's at [r]); layout: a V (ZB-V, DualPipeV:
// chunk 1 comes back up, the last rank turns it in memory) or a line (one
// chunk, ZB-H1). For each op of `stage`'s order: -1 if it sends nothing over
// a link, else the index of the op at whose start its send is waited (the
// order's size: the schedule's end). Errors: orders that cannot run together.
std::vector<int> send_release_points(const std::vector<std::vector<ScheduledOp>>& orders, int stage,
                                     ChunkLayout layout);

}  // namespace loom::parallel
