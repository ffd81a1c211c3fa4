// The tensor-core flash attention's per-lane math (FlashAttention-2, Dao 2023,
// its warp-level loop), written once for the CUDA kernel
// (tensor/cuda/fast/flash_attention_mma.cu) and the CPU simulation of its
// warps (tests/test_flash_attention_mma.cpp), which runs these functions for
// 32 lanes with a model of the mma instruction in between.
//
// A block is 4 warps; warp w owns the 16 query rows r0 + 16w.. of the block's
// 64. Per K/V tile of kKeys = 64 keys, each warp:
//   S [16 x 64] = Q Kᵀ           8 x HD/16 mma (fp32 results, 4 per lane per 8 keys)
//   scale_and_mask               s = scale S, -inf in the future / past T; this lane's row maxima
//   (the 4 lanes of a row: a max over their group, two shuffles)
//   softmax_tile                 m' = max(m, tile max); O, l *= exp(m - m'); P = exp(s - m')
//                                into l, and into 16-bit A fragments (mma::c_pair_to_a)
//   O [16 x HD] += P V           4 x HD/8 mma
// and at the end (after the same group sum of l): O / l and L = m + log l.
// The row state (tensor/kernels/flash_attention.h's m, l, acc) is split over
// the 4 lanes of each row: lane 4g + t holds rows g and g + 8 (mma::c_row),
// columns 2t, 2t+1 of each 8 (mma::c_col), and its own part of l.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/kernels/exp.h"
#include "tensor/kernels/mma_fragment.h"

namespace loom::kernels::flash_mma {

constexpr int kWarps = 4;      // per block
constexpr int kWarpRows = 16;  // query rows per warp: an mma's M
constexpr int kBlockRows = kWarps * kWarpRows;  // a block's query rows
constexpr int kKeys = 64;      // keys per K/V tile in shared memory
constexpr int kKeyTiles = kKeys / mma::kN;  // S's fragments per tile (8 keys each)
// Shared rows are HD + 8 elements long: consecutive rows then start 4 banks
// apart, so the 8 rows one B-fragment load touches hit 8 different bank
// quartets (at HD + 0, all 8 rows start on the same bank: 8-way conflicts).
constexpr int kPad = 8;

// One lane's share of its warp's 16 query rows (rows g and g + 8).
template <int HD>
struct RowState {
  float o[HD / mma::kN][4];  // O's C fragments: fragment j holds columns 8j..8j+7
  float m[2];                // running max of the scaled scores (-inf: nothing seen)
  float l[2];                // this lane's part of sum exp(s - m)
};

template <int HD>
LOOM_HOST_DEVICE void start_rows(RowState<HD>& st) {
  LOOM_UNROLL
  for (int j = 0; j < HD / mma::kN; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) st.o[j][e] = 0.f;
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) st.m[r] = -INFINITY, st.l[r] = 0.f;
}

// s [8][4]: Q Kᵀ of the tile's keys key0.. for the warp's rows row0.. (C
// fragments). Becomes scale s, or -inf where the key is in the row's future
// or at/after T (flash::score_tile's rule); tile_max: this lane's max per row.
LOOM_HOST_DEVICE void scale_and_mask(int lane, float (&s)[kKeyTiles][4], float scale, int key0, int row0, int T,
                                     float (&tile_max)[2]) {
  tile_max[0] = tile_max[1] = -INFINITY;
  LOOM_UNROLL
  for (int j = 0; j < kKeyTiles; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + mma::kN * j + mma::c_col(lane, e), row = row0 + mma::c_row(lane, e);
      s[j][e] = key <= row && key < T ? scale * s[j][e] : -INFINITY;
      tile_max[e / 2] = s[j][e] > tile_max[e / 2] ? s[j][e] : tile_max[e / 2];
    }
}

// row_max: the tile's max of each row over the 4 lanes (finite: every tile
// the kernel visits holds key key0 <= r0, which each of its rows sees).
//   m' = max(m, row_max),  c = exp(m - m'),  O *= c,  l *= c,  p = exp(s - m'),  l += p
// p becomes P's A fragments in the 16-bit type S (the next product's operand);
// l sums p before that rounding, as FlashAttention-2 does.
template <int HD, class S>
LOOM_HOST_DEVICE void softmax_tile(const float (&row_max)[2], float (&s)[kKeyTiles][4], RowState<HD>& st,
                                   uint32_t (&p)[kKeys / mma::kK][4]) {
  float c[2];
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) {
    const float m_new = row_max[r] > st.m[r] ? row_max[r] : st.m[r];
    c[r] = m_new == st.m[r] ? 1.f : exp_approx(st.m[r] - m_new);
    st.l[r] *= c[r];
    st.m[r] = m_new;
  }
  LOOM_UNROLL
  for (int j = 0; j < HD / mma::kN; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) st.o[j][e] *= c[e / 2];
  LOOM_UNROLL
  for (int j = 0; j < kKeyTiles; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) {
      s[j][e] = exp_approx(s[j][e] - st.m[e / 2]);  // exp(-inf) = 0 for hidden keys
      st.l[e / 2] += s[j][e];
    }
  LOOM_UNROLL
  for (int kk = 0; kk < kKeys / mma::kK; ++kk) mma::c_pair_to_a<S>(s[2 * kk], s[2 * kk + 1], p[kk]);
}

// After l is summed over the row's 4 lanes (row_sum): O = O / l; returns L = m + log l per row.
template <int HD>
LOOM_HOST_DEVICE void finish_rows(RowState<HD>& st, const float (&row_sum)[2], float (&lse)[2]) {
  LOOM_UNROLL
  for (int j = 0; j < HD / mma::kN; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) st.o[j][e] *= 1.f / row_sum[e / 2];
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) lse[r] = st.m[r] + std::log(row_sum[r]);
}

}  // namespace loom::kernels::flash_mma
