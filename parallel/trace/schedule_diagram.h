// Seeing a pipeline schedule: what each stage actually ran, drawn like the
// figures of the GPipe and PipeDream-1F1B papers (one row per stage, one column
// per time slot), and the bubble - the fraction of a step a stage sits idle.
//
//   1f1b, pp 4, m 8 (F<i>/B<i>: forward/backward of micro-batch i; . idle)
//   stage 0 | F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7
//   stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .
//   stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .
//   stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  .
//   bubble: measured 0.341 with transfers, 0.291 without (...), theory (p - 1)/(m + p - 1) = 3/11 = 0.273
//
// Columns come from the executed order alone: every forward and backward takes
// one slot, a stage runs its operations in the order it logged them, F<i> on
// stage s waits for F<i> on stage s - 1 and B<i> for B<i> on stage s + 1. The
// measured bubble uses the real timestamps: per stage 1 - busy / step time,
// averaged over stages, where busy is the forwards and backwards alone, so the
// time a stage waits for a transfer (send, receive, the peer's scheduling)
// counts as idle. The bubble "without transfers" replays the same forwards and
// backwards, with their measured lengths, each starting the moment its stage
// is free and its input has been computed: the bubble that unequal stages
// alone leave. With p stages, m micro-batches, equal stages and instant
// transfers the theory is (p - 1)/(m + p - 1) (GPipe, Huang et al. 2019), for
// AFAB and 1F1B alike.
//
// Interleaved 1F1B (v model chunks per stage) logs the chunk too: F3.1 is the
// forward of micro-batch 3 on chunk 1. F<i>.<c> on stage 0 waits for
// F<i>.<c-1> on the last stage (the ring), B<i>.<c> on the last stage for
// B<i>.<c+1> on stage 0. Each slot is then a chunk's work, 1/v of a stage's,
// so the flush costs p - 1 of v m slots: the bubble is (p - 1)/(v m + p - 1)
// of the step, which Megatron writes as bubble/compute = (p - 1)/(v m)
// (Narayanan et al. 2021).
//
// A zero-bubble schedule (zero_bubble_schedule.h) logs each backward as B<i>
// (the input gradient) and W<i> (the weights'), each a slot of its own; W
// waits for nothing but its stage's own B<i>, which ran before it. In a V
// (ZB-V, DualPipeV: ChunkLayout::V) chunk 1 comes back up the stages: F<i>.1
// waits for F<i>.1 on the stage after, and on the last stage for its own
// F<i>.0 (the turn); B<i>.1 for B<i>.1 on the stage before; B<i>.0 on the
// last stage for its own B<i>.1.
#pragma once

#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/pipeline_parallel/partition.h"

namespace loom::parallel {

struct ScheduleEvent {
  char kind = 'F';        // 'F' forward, 'B' backward (or its input half), 'W' its weights' half
  int mb = 0;             // micro-batch
  double start_us = 0;    // CLOCK_MONOTONIC (steady_clock): shared by the ranks of one machine
  double end_us = 0;
  int chunk = 0;          // model chunk (virtual stages); 0 without them
};
using StageEvents = std::vector<ScheduleEvent>;  // one stage's events, in execution order

// The steady clock in microseconds, for ScheduleEvent times.
double schedule_clock_us();

// slot[s][k]: the time slot of stage s's k-th event (see above). Throws if the
// order is impossible (an event waits for one that never comes).
// layout: where the chunks sit (a V turns on the last stage; partition.h).
std::vector<std::vector<int>> schedule_slots(const std::vector<StageEvents>& stages,
                                             ChunkLayout layout = ChunkLayout::Interleaved);

// The diagram text (title line, one row per stage; cells F3.1 when there are chunks).
std::string render_schedule(const std::vector<StageEvents>& stages, const std::string& title,
                            ChunkLayout layout = ChunkLayout::Interleaved);

// 1 - busy / span per stage, averaged over stages; span is the first start to
// the last end over all stages.
double measured_bubble_fraction(const std::vector<StageEvents>& stages);
// 1 - busy / span of the busiest stage: the paper's "bubble rate" (Qi et al.
// 2024, section 5.3: the longest stage's time against its own work). The
// formulas assume equal stages; when one stage's work is shorter (the V's
// stage 0 holds only the embedding and the head), the mean above also counts
// its spare time as bubble, this does not: the step waits on the busiest one.
double busiest_stage_bubble_fraction(const std::vector<StageEvents>& stages);
// The same events, replayed with instant transfers: each starts when its
// stage is free and its dependency has ended (times from 0), lengths kept.
std::vector<StageEvents> without_transfers(const std::vector<StageEvents>& stages,
                                           ChunkLayout layout = ChunkLayout::Interleaved);
// The same, every transfer between ranks taking latency_us from the end of
// the event that sends to the start of the one that receives (the V's turn,
// in memory, none). Sends never hold their stage (pipeline_p2p.h), so a
// transfer delays the step only where the order gives its receiver nothing
// else to do meanwhile: what DualPipeV's pairs change (dualpipev_schedule.h).
std::vector<StageEvents> with_transfer_latency(const std::vector<StageEvents>& stages, double latency_us,
                                               ChunkLayout layout = ChunkLayout::Interleaved);
// (p - 1)/(v m + p - 1); v = 1: (p - 1)/(m + p - 1).
double theoretical_bubble_fraction(int pp_size, int num_microbatches, int num_chunks = 1);
// ZB-H1 with F, B and W of equal length (zero_bubble_schedule.h): (p - 1)(F + B - W)
// idle per stage against m (F + B + W) busy, (p - 1)/(3 m + p - 1).
double zb_h1_bubble_fraction(int pp_size, int num_microbatches);
// ZB-V and DualPipeV (zbv_schedule.h, dualpipev_schedule.h) with F, B and W of
// equal length on a chunk: p - 1 idle chunk slots per stage against 6 m busy,
// (p - 1)/(6 m + p - 1) - half of ZB-H1's idle time.
double zb_v_bubble_fraction(int pp_size, int num_microbatches);

// Collective over pp_group: every stage's events, on pp rank 0 (empty elsewhere).
std::vector<StageEvents> gather_schedule(ProcessGroup& pp_group, const StageEvents& mine);

// Collective over pp_group: the --print-schedule text (diagram and bubble line)
// on pp rank 0, "" elsewhere; svg: also the picture (schedule_svg.h), on pp rank 0.
std::string schedule_report(ProcessGroup& pp_group, const StageEvents& mine, const std::string& schedule_name,
                            std::string* svg = nullptr);

}  // namespace loom::parallel
