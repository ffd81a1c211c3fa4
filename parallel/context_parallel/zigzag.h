// The zig-zag split of context parallelism: which tokens of each sequence a cp
// rank holds. The sequence (T tokens) is cut into 2N chunks of T / 2N; rank r
// holds chunk r and chunk 2N-1-r, in that order. Under a causal mask a token
// late in the sequence attends to more keys than an early one, so handing each
// rank one early and one late chunk gives every rank the same work
// (ring_attention.h draws it; Brandon et al. 2023 "Striped Attention", and
// zhuzilin/ring-flash-attention's zigzag_ring_flash_attn).
//   T = 16, N = 2:  chunks  0 1 2 3   (4 tokens each)
//                   rank 0  0 . . 3   positions 0-3 and 12-15
//                   rank 1  . 1 2 .   positions 4-7 and 8-11
#pragma once

#include <array>
#include <vector>

#include "tensor/tensor.h"

namespace loom::parallel {

// Throws, naming the values, unless T splits into 2 * cp equal chunks: the one
// place this rule lives (the model builder, train_gpt's flag checks and
// loom_plan's call it; the message names train_gpt's flags).
void check_zigzag_split(int64_t T, int cp);

// The true positions of the T / cp tokens cp rank r holds: [T / cp] int64.
Tensor zigzag_positions(int64_t T, int cp, int r);

// Where rank r's two chunks start, {r c, (2cp - 1 - r) c} with c = T / 2cp:
// RoPE turns each chunk from its first true position (nn::rope_chunks).
std::vector<int64_t> zigzag_chunk_starts(int64_t T, int cp, int r);

// The two chunks cp rank r holds, in its order: {r, 2cp - 1 - r}.
std::array<int64_t, 2> zigzag_chunks(int r, int cp);

// One block of causal attention in a ring step: rank r's query chunk i (of
// its two) against key chunk j of the K/V it holds; diagonal: the same chunk,
// whose queries see only the keys before them (the causal mask inside).
struct ZigzagBlock {
  int i, j;
  int64_t q_chunk, k_chunk;
  bool diagonal;
};
// The blocks rank r computes with cp rank src's K/V: the pairs whose keys are
// not later than the queries (a later chunk is all future), in (i, j) order.
std::vector<ZigzagBlock> zigzag_blocks(int r, int src, int cp);

// x's entries along dim (of length T) that cp rank r holds, contiguous:
// [..., T, ...] -> [..., T / cp, ...] (token ids, targets; tests: q, k, v).
Tensor zigzag_take(const Tensor& x, int64_t dim, int cp, int r);

}  // namespace loom::parallel
