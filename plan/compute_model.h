// FLOPs of a planned run, and the time a device takes for them.
//
// Per token, per transformer layer, forward (Megatron's count, Narayanan et
// al. 2021, section 5.1): the four weight GEMMs 2 x 12 h^2 = 24 h^2, and
// attention's two s x s products (Q K^T, then weights x V) 2 x 2 s h = 4 s h,
// counted in full as Megatron does although causal masking wastes half. The
// head's logits add 2 V h per token. Backward costs twice the forward, so one
// step is
//     F = 3 x tokens x (L (24 h^2 + 4 s h) + 2 V h)
//       = 72 B s L h^2 (1 + s / (6 h) + V / (12 L h))        B = sequences per step
// which is 6 N tokens for the GEMMs (N ~ 12 L h^2) plus attention and logits.
// Full recomputation runs each layer's forward twice: hardware FLOPs use 4
// instead of 3 for the layers (Megatron's 96 B s L h^2 (...) formula); model
// FLOPs (MFU) never count it. Llama's blocks: 24 h² becomes 2 x the block's
// matmul weights (ModelShape::block_matmul_params: SwiGLU's 3 h F, GQA's 2 h kv).
// Context parallelism: a rank computes s / cp tokens of every GEMM and, with
// the zig-zag split, 1/cp of each sequence's attention: everything / cp.
#pragma once

#include <cstdint>

#include "plan/config.h"
#include "plan/machine.h"

namespace loom::plan {

// Forward FLOPs for one sequence of one transformer layer, and of the head.
double layer_forward_flops(const ModelShape& m);
double head_forward_flops(const ModelShape& m);
// The forward FLOPs backward reruns, of layers_fwd (this rank's layers' forward):
// all of it with full recomputation, the attention cores' with selective, none without.
double recompute_forward_flops(const ModelShape& m, const Grid& g, double layers_fwd);

// Model FLOPs of one optimizer step (all ranks together): forward + backward.
double model_flops_per_step(const ModelShape& m, const Grid& g, const Batch& b);

// One rank's compute for one micro-batch on pipeline rank `stage`, in
// seconds, forward and backward (backward includes recomputation).
struct StageCompute {
  double forward_s = 0, backward_s = 0;
  double flops = 0;  // hardware FLOPs of forward + backward on this rank
};
StageCompute stage_compute(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage);

// FLOP/s one rank reaches while it computes: peak x efficiency. (When ranks
// outnumber this CPU's cores, they take turns: step_time.h bounds the step by
// all ranks' compute over the cores.)
double rank_flops_per_s(const Machine& mc, const Grid& g);

}  // namespace loom::plan
