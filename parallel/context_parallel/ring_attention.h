// Ring attention (Liu et al. 2023), the attention of context parallelism: each
// of the N ranks of the cp group holds T / N tokens of every sequence, and
// attention - the one layer where a token needs the others - runs as a ring.
// Forward: each rank keeps its queries and passes its K/V block to the next
// rank while it computes with the block it holds; after N steps every query
// has met every key, and the partial results were merged with the online
// softmax rule (Milakov & Gimelshein 2018; FlashAttention), per row:
//   m' = max(m, rowmax(S))                      the running max
//   l' = l e^(m - m') + rowsum(e^(S - m'))      the running sum of exponentials
//   acc' = acc e^(m - m') + e^(S - m') V        the running, unnormalised output
//   out = acc / l,   lse = m + log l            (the log-sum-exp, saved for backward)
// Backward runs the ring the other way: the K/V blocks travel again, each with
// the dK/dV accumulated for it so far, and after N hops they are home.
//
// The split is zig-zag (zigzag.h): rank r holds chunks r and 2N-1-r of the 2N
// chunks of a sequence. N = 2, T = 4 chunks, the causal score matrix:
//             keys: 0  1  2  3
//   queries 0       ◣  .  .  .      rank 0: rows 0 and 3: 2 ◣ + 3 ■
//           1       ■  ◣  .  .      rank 1: rows 1 and 2: 2 ◣ + 3 ■
//           2       ■  ■  ◣  .      (a contiguous split: 2 ◣ + 1 ■ against 2 ◣ + 5 ■)
//           3       ■  ■  ■  ◣      ◣ the diagonal block (causal mask), ■ all visible, . nothing
// Each step, rank r with the K/V of rank src does equal work on every rank:
//   src == r  its own chunks: the two diagonal blocks and late-query x early-key
//   src <  r  both query chunks x src's early chunk (its late one is in the future)
//   src >  r  the late query chunk x both of src's chunks (the early queries see none)
//
// Shapes: q, k, v [B, H, T / N, hd], the rank's two chunks in that order ->
// out [B, H, T / N, hd]. Math in fp32 (fp64 for fp64 inputs); K/V travel in
// their own dtype, dK/dV in the math's.
#pragma once

#include "nn/attention.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// Causal attention of the zig-zag chunks over the cp group (a differentiable
// function: its backward is the second ring). Collective over cp.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, ProcessGroup& cp);

// The seam of nn/attention.h: ring attention as an AttentionCore. Attention
// dropout is refused (its mask would differ from one process's).
nn::AttentionCore ring_attention_core(ProcessGroup& cp);

}  // namespace loom::parallel
