// What a mixture-of-experts block (nn/moe.h) keeps for backward and what its
// backward adds at its peak, in place of the dense MLP's terms of
// optim/activation_memory.h; --memory-report's "activ. peak" for --experts.
// N tokens, k experts each, M = N k rows (dropless), E experts of width I, C
// the width, e the model's bytes; the router works in fp32 for 16-bit models.
//
//   kept by                     tensor                                     bytes
//   softmax                     probs [N, E]                               4 N E (e for fp32)
//   the renormalisation         the picked probs [N, k], their sum [N, 1]  4 (N k + N)
//   unpermute's weighting       the weights [N, k]                         e N k
//   gather, permute, unpermute  the chosen experts, each row's token and   8 (N k + M + N k)
//                               each slot's row, int64 indices
//   each expert's w1 and w3     the permuted rows [M, C]                   e M C
//   each expert's SwiGLU        gate, silu, up, product [M, I]             4 e M I
//   unpermute's gather          its input, the rows + a zero row [M + 1, C] e (M + 1) C
//   unpermute's weighting       each slot's row [N, k, C]                  e N k C
// (measured = this to the byte on one layer, fp32: N 256-512, C 32-64, E 1-8,
// k 1-2, I 88-1024).
//
// The moments that can be the peak, above what is kept:
//   (U) the last block's FORWARD, at unpermute's weighted sum, before the
//       stage's output and the head's tensors exist: the experts' output
//       [M, C] and the logits [N, E] the layer's forward still holds, the
//       weighted slots [N, k, C], the sum's float64 accumulator [N, C] and
//       its result: e M C + e N E + e N k C + 8 N C + e N C. The peak of the
//       laptop config (docs/19-mixture-of-experts.md), found by recording the
//       allocation that made each new peak.
//   (M) unpermute's backward, the last block first: the weighting's (each
//       slot's row's gradient, the product for the weights' gradient, its
//       float64 sum and result: 2 e N k C + (8 + e) N k), or index_select's
//       (index_add: its source in fp32, a copy for 16-bit; its fp32 sum over
//       the M + 1 rows; for 16-bit the rounded result: 4 N k C + 4 (M + 1) C
//       (+ e (M + 1) C)). The peak of bf16 and fp16 there.
//   (X) the largest group's SwiGLU backward (its M_g rows): w2's dx and the
//       product's two gradients [M_g, I] each, the product freed, less what
//       unpermute's backward freed by then (its [M + 1, C] input, the
//       slots [N, k, C], an int64 [M] index): e (2 M_g I - 2 M C - C) - 8 M.
//       Measured on one layer with E = 1. With several experts it is walked
//       expert by expert over the routing's groups (the run's own, each
//       micro-batch's: local_experts_backward in moe_activations.cpp), with
//       each expert's .grad tensors (fp32 without a main_grad buffer, the
//       model's dtype under ZeRO-3) and the experts' output gradient alive
//       until the last: the largest group alone (what the planner reads)
//       was 0.8% under the measurement at I = 512, one process.
// Measured = formula to the byte (+ the loss's scalars) on --layers 1-2, --embd
// 32 and 64, --batch 8 and 16, k 1 and 2, E 4 and 8, fp32, bf16, fp16, and
// --grad-accum 2 (tests/test_memory_ledger_moe.cpp).
//
// Expert parallelism (--ep, parallel/expert_parallel/token_dispatcher_all_to_all.h):
// a rank's E / ep experts compute the R rows the ep group routed to them (the
// routing's: R_l for block l, M_j for local expert j, summed over the ep
// group's micro-batches), R = M on average. What the dispatch and combine
// keep, in the permuted rows' e M C place:
//   dispatch's sort (index_select)  the received rows [R, C]        e R C
//   each local expert's w1 and w3   the sorted rows [R, C]          e R C
//   the unsort (index_select)       the experts' output [R, C]      e R C
//   the sort and the unsort         their int64 indices [R] each    16 R
//   each expert's SwiGLU            4 [R, I], over the local groups 4 e R I
// (the all-to-alls keep only their split sizes). The moments:
//   (U) + e M C: the permuted rows, sent and kept by no one, alive until the
//       layer's forward returns.
//   (M) as on one process (the combine's backward comes after it).
//   (X) walked over the local experts, the last first (cat's backward): at
//       expert j's product backward 2 e M_j I, or its w2's backward
//       temporaries (16-bit on fp32 copies: the larger), above what is alive,
//       which loses each expert's 4 e M_j I once done, gains the summed input
//       gradient [R, C] after the first and loses the output gradient [R, C]
//       at the last; the unsort's indices are freed by then (- 8 R + 8).
//   (K) before (X), the unsort's backward: the combine's gradient [R, C] and
//       index_add's sum [R, C] fp32 (16-bit: on an fp32 copy of the source,
//       rounded into a new tensor): e R C + 4 R C (+ 4 R C + e R C).
// Measured = formula to the byte on every rank (tests/test_memory_ledger_moe.cpp's
// ep runs; the laptop config at dp 2 ep 2, dp 4 ep 2 and 4, fp32, bf16 native
// and through fp32, fp16, k 1, E 8, --embd 32, I 512). With --grad-accum each
// micro-batch routes its own rows here, and an earlier one that routed more
// can be the peak: the caller (train/diagnostics.cpp) predicts each micro-batch's
// and takes the largest (the last's alone was up to 3.1% under, dp 4 ep 2, I 512).
// ZeRO-1/2 change none of it (dp 4 ep 2, ZeRO-1 bf16 and ZeRO-2 fp32: to the byte).
// --recompute full: each block's rerun holds the rows its own dispatch received
// (the last block's moments read moe_local_groups' sum, not the blocks' mean R);
// the caller walks every block's rerun and takes the costliest (dp 2 ep 2 fp32,
// and bf16 C 32, where (K) peaks on one rank: to the byte).
//
// Tensor parallelism (parallel/tensor_parallel/block.h): the router and the
// experts are whole on every tp rank, so is all of the above (not / t, as
// the dense MLP's tensors are); a rank routes the tokens it holds, N = b s,
// or b s / t under sequence parallelism, where the router keeps its sharded
// input [N, C] in place of the MLP's gathered copies. Full recomputation
// reruns the last block's forward inside its backward: (U) again, the head's
// tensors and the stage's output freed, the block's output gradient alive and
// the whole block rebuilt beside its kept input (activation_moments.cpp's
// moe_rerun). Measured = formula to the byte on every rank: tp 2 fp32, tp 2
// SP bf16, each also with --recompute full, tp 2 SP with dp 2 ep 2, and
// --recompute full fp32 and bf16 on one process.
//
// Shared experts (--shared-experts S: one SwiGLU of width S I beside the
// routed ones, cut over tp as a dense MLP): each block keeps their gate,
// silu, up and product, 4 e b s S I / t (+ 2 e b s C under SP: c_gate's and
// c_fc's gathered inputs). Their forward comes after (U), where their
// tensors do not exist yet; the last block's forward can then peak at
//   (S) the routed and shared outputs' sum: e M C + e N E (still held by
//       the forward) + 3 e N C; under tp at the shared c_proj's collective
//       before it (its partial sums [b s, C] and their sum, SP's laid-out
//       copy and result [N, C], 16-bit's fp32 buffers), as the dense (F).
// Their backward runs first (the sum's second input): a dense SwiGLU's (B)
// and (B'), then (M) and (X) with their tensors freed and their input
// gradient e N C alive (and, with .grad tensors, their three matrices').
// Measured = formula to the byte: one process S 1 ((S)) and S 2 ((B')),
// fp32, bf16, fp16, k 1, --grad-accum 2, --recompute full; every rank of
// dp 2, dp 2 ep 2, dp 4 ep 2 ZeRO-1 bf16, tp 2 (fp32, bf16, recompute
// full), tp 2 SP (fp32; bf16, the collective's peak; recompute full) and
// pp 2 (its last stage less the sent gradient, as above).
//
// A capacity (--capacity-factor): each expert computes at most its capacity
// of rows, the rest of its slots dropped, so M above is the rows the routing
// kept (ActivationCase::moe_kept_rows, the blocks' mean, for what is kept;
// moe_last_rows, the last block's, at the moments); the slots [N, k, C] and
// each slot's row stay N k, so (X)'s base frees e ((M + 1) C + N k C) + 8 N k.
// Measured = formula to the byte: one process fp32 (11.5% dropped), bf16 with
// a shared expert (23%), --grad-accum 2 and 4 (each micro-batch's rows, the
// costliest taken), every rank of dp 2, dp 2 ep 2 (I 88 and 512, --recompute
// selective, --grad-accum 4), dp 4 ep 2 ZeRO-1 bf16, tp 2 fp32 and bf16, and
// ZeRO-3 dp 2 (--grad-accum 2). Under --recompute full an earlier block's rerun
// can peak, and under a pipeline the micro-batches in flight each keep their own
// rows: train/diagnostics_moe.cpp walks both (one process fp32, where the first
// block's rerun peaks; pp 2 at m 2 and 4, to the byte on stage 0, its last stage
// as a pipeline's). The interleaved and zero-bubble walks read each micro-batch's
// own rows too (train/diagnostics_moe.cpp's chunk_rows). ZeRO-3's bytes beside
// these: optim/zero3_activations.h (and, under ep, the (X) walk above counts each
// expert's .grad tensors, kept until the experts' unit is reduce-scattered).
//
// A split backward (zero bubble: optim/split_backward.h). B makes each linear's
// dx only; its X and dY wait for W. What a MoE block's linears hold from B to W,
// R the rows this rank's experts computed (M on one process):
//   the router's gate    X ln_2's output (the caller's)  dY the logits' gradient [N, E]
//   w1, w3 of expert j   X its rows [R_j, C] (views of the permuted rows)  dY [R_j, I] each
//   w2 of expert j       X the product [R_j, I]  dY [R_j, C], a view of the experts'
//                        output gradient: unpermute's [M + 1, C] (its zero row too)
//                        on one process, the unsort's [R, C] under ep
//   the shared experts   as a dense SwiGLU's (c_proj's dY: the block's output gradient)
// B's moments in the block: (M) as unsplit; then (X) walked expert by expert in
// the order backward takes them (the last first), each at its product's backward
// with w2's dx and the product's two gradients, the product itself held (3 e R_j I),
// or at w2's dx temporaries; each expert done frees its gate, silu and up but holds
// w1's and w3's dY (net e R_j I freed); the experts' output gradient stays until W
// (the unsplit walk frees it at the last expert); no .grad tensors.
// With shared experts their B comes first: c_proj's dx, then the product's backward
// with the product held (3 [b s, S I / t]), then the routed moments beside what they
// hold. The walk reads each micro-batch's last block's groups (train/diagnostics_moe.cpp),
// since B is the peak of one micro-batch, not of their mean. Measured = formula to the
// byte, but the loss's 8 bytes, on every rank (tests/test_memory_ledger_moe.cpp's zero-bubble
// runs): zb-h1 pp 2 and 3, fp32 and bf16, I 88 and 512, E 4 and 8, k 1 and 2,
// --layers 2-6, --shared-experts 1 and 2, --capacity-factor 0.8 and 1.0, dp 2 ep 2,
// tp 2, ZeRO-3 (with ep, I 512 and shared experts too), zb-v and dualpipev at pp 2
// and 3 (with ep, shared experts and a capacity). Under ep with I 512 the formula is
// 8 bytes above the measurement on two ranks (the loss's scalars elsewhere).
#pragma once

#include "optim/activation_memory.h"

namespace loom::optim {

// Bytes one MoE block keeps per micro-batch, what the table above lists: with a capacity, the blocks'
// mean (their rows' mean), or the last block's.
double moe_kept_bytes(const ActivationCase& c, bool last_block = false);

// The MoE block's backward at its peak above what is kept: the larger of (M) and (X) (and, with shared
// experts, of their backward's, which runs first).
double moe_backward_bytes(const ActivationCase& c);

// Under a split backward (zero bubble, optim/split_backward.h): what the MoE block's linears hold from B
// to W, the router's and the experts' X and dY (the blocks' mean rows), ln_2's output left to the caller,
// and the shared experts' (their c_proj's dY, the block's output gradient, only if output_gradient).
double moe_held_until_w(const ActivationCase& c, bool output_gradient = true);

// B's MoE moments under a split backward: (M), then (X) walked over moe_local_groups (this rank's experts'
// rows in the last block; all the experts' on one process), with what the experts' linears hold for W.
double moe_split_backward_bytes(const ActivationCase& c);

// (U)'s temporaries: the last block's forward at unpermute's weighted sum, above what it keeps.
double moe_forward_bytes(const ActivationCase& c);

}  // namespace loom::optim
