// A pipeline rank's activation peak walked through its own schedule (optim/pipeline_activations.cpp):
// how many micro-batches a rank keeps, its order over its chunks, and the walk of interleaved 1F1B, ZB-H1
// and the V's over each chunk's predict_activations (optim/activation_memory.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optim/activation_memory.h"
#include "optim/zero3_activations.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"

namespace loom::optim {

// 1F1B, AFAB or interleaved: micro-batches a pipeline rank keeps at its peak (interleaved: the chunks' average).
double micro_batches_in_flight(const char* schedule, int64_t micro_batches, int pp, int stage, int virtual_stages);

// A rank's order over its chunks: interleaved 1F1B's, a V's ("zb-v", "dualpipev"), or ZB-H1's (one chunk).
std::vector<parallel::ScheduledOp> chunk_order(const std::string& schedule, int pp, int stage, int virtual_stages,
                                               int64_t micro_batches);

// One of an interleaved rank's model chunks.
struct ChunkActivations {
  int64_t blocks = 0;         // transformer blocks in the chunk
  bool has_head = false;      // the last virtual stage
  bool has_embedding = false; // the first virtual stage
  int64_t grad_bytes = 0;     // its params' .grad tensors, when there is no main_grad buffer (else 0)
  Zero3Held zero3;            // ZeRO-3: the chunk's own units (optim/zero3_activations.h; `on` false without)
};

// One micro-batch of a pipeline chunk with its own rows (train/diagnostics_moe.cpp's chunk_rows): the case, and
// under --recompute full with a capacity or --ep each of the chunk's MoE blocks rerun with that block's rows, as
// the last of the chunk's blocks less rerun_blocks_after (the blocks past it done: their inputs let go, their
// .grad tensors alive). reruns is empty otherwise.
struct RoutedRows {
  ActivationCase rows;
  std::vector<ActivationCase> reruns;
};

// Interleaved 1F1B (--virtual-stages > 1; optim/pipeline_activations.cpp). No one in-flight count fits: the
// chunks hold different numbers of micro-batches at each moment, and only one of them has the head. So this
// walks the rank's own schedule (parallel::interleaved_order): a forward of chunk k adds k's per-micro-batch
// bytes (a MoE block's forward (U) is a candidate peak), a backward is a candidate peak (everything kept,
// plus k's backward temporaries, plus the .grad tensors of the chunks whose backward has run; under ZeRO-3
// the other chunks' units still gathered) and then frees them. c gives the shapes, dtype, tp and the step's
// tokens; its blocks, head, embedding, in_flight and grad_bytes are the chunks'. Like predict_activations,
// one input gradient sent by an earlier backward counts as in flight. The result's per_micro_batch is what
// all the chunks keep at the peak; per_block is not set. schedule "zb-h1" (one chunk), "zb-v" or
// "dualpipev" walks that order instead (chunk_order): a B is a candidate peak with B's own temporaries
// (split_extra), then trades the micro-batch's kept bytes for what it holds until its W (held_until_w),
// which W frees. routed ([chunk][micro-batch], or null): c with the rows that micro-batch's routing kept
// (a capacity) or sent this rank's experts (--ep) in the chunk's MoE blocks (train/diagnostics_moe.cpp); with
// reruns, a backward's temporaries are its costliest block's rerun.
ActivationPrediction predict_activations_interleaved(const ActivationCase& c, const std::vector<ChunkActivations>& chunks,
                                                     int pp, int stage, const std::string& schedule = "1f1b",
                                                     const std::vector<std::vector<RoutedRows>>* routed = nullptr);

}  // namespace loom::optim
