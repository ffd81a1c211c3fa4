// Context parallelism's part of the activation count (activation_memory.h):
// under --cp the attention core is ring attention
// (parallel/context_parallel/ring_attention.h), which keeps other tensors than
// the composed or fused core, and the micro-batch's tokens are copies.
//
// Per block (s = T / cp tokens a sequence on this rank, N = b s, a/t heads,
// math bytes m: 4, 8 for fp64), what the ring saves for backward besides its
// inputs q, k, v (views of c_attn's output, counted as for the plain core):
//   out  [b, a/t, s, hd]  m bytes     the merged online softmax's output
//   lse  [b, a/t, s, 1]   m bytes     its log-sum-exp
// in place of the softmax [b, a/t, s, s] (no [s, s] tensor outlives a ring step).
// Around the blocks: the embedding's zig-zag positions are the layer's own
// tensor, made once (nn/gpt.h's position_ids: no [s] int64 a micro-batch);
// each micro-batch's ids and targets are zig-zag copies [b, s] int64 each,
// all of the step's made before its first forward (examples/train_step.cpp).
//
// The ring's backward (C under cp) at its last step, above the moment's
// residual gradients: the core's incoming gradient [N, h/t] (e bytes; 16-bit
// also its fp32 copy, and q's fp32 copy), dq [N, h/t] and D = rowsum(dO out)
// [N, a/t] in m bytes, the K/V block held [2, N, h/t] (e bytes), and in m
// bytes three [2, N, h/t] buffers: the step's dK/dV, the last step's on its
// way (the hop holds it), the arriving one; at cp > 2 the middle steps also
// hold the next K/V block [2, N, h/t] (e bytes); plus one block's
// temporaries: 16-bit copies of k and v [b, a/t, c, hd] (c = s / 2, a
// chunk), and at most four [b, a/t, c, c] score-shaped tensors or two and a
// [b, a/t, c, hd] product. The peak when a s / h is large (many heads, long
// sequences), and in full recomputation's rerun in 16-bit.
// Measured = formula to the byte (+ the loss's scalars) on every rank of
// tests/test_memory_ledger.cpp's and test_memory_ledger_moe.cpp's cp modes
// and of --cp 2 (fp32, bf16, fp16; --zero, --grad-accum 2, --recompute
// selective and full; --dp 2; --tp 2, with SP bf16 full; Llama GQA; --pp 2,
// its last stage less a sent gradient as activation_memory.h says;
// interleaved, ZB-H1, ZB-V) and --cp 4 (fp32, bf16), at --block 16 to 256
// and --heads 2 to 8 (the test's cp2_fp32_ring, cp2_bf16_full and
// cp2_bf16_selective_ring peak in the ring's backward; cp4_fp32_ring in a
// middle step's, with the next K/V block: 2.4% short without it).
#pragma once

#include "optim/activation_memory.h"

namespace loom::optim {

struct Sizes;

// The ring's math dtype's bytes: fp64 for fp64 models, else fp32.
double ring_math_bytes(const ActivationCase& c);
// What one block's ring keeps for backward (out, lse), bytes; 0 without cp.
double ring_kept_bytes(const ActivationCase& c, const Sizes& z);
// The step's zig-zag copies of the micro-batches' ids and targets, bytes; 0 without cp.
double ring_token_bytes(const ActivationCase& c, const Sizes& z);
// The ring's backward at its last step, above the residual gradients (the header's list).
double ring_backward_bytes(const ActivationCase& c, const Sizes& z);

}  // namespace loom::optim
