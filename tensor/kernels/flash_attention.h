// Flash attention's per-tile math (Dao et al. 2022, "FlashAttention"; the loop
// order of FlashAttention-2, Dao 2023), written once for the CUDA kernels
// (tensor/cuda/fast/flash_attention*.cu) and the CPU loop that runs them tile
// by tile in the kernels' order (tensor/ops_flash_attention.cpp), so the CPU
// tests test the GPU's arithmetic.
//
// Causal attention of one head, q, k, v [T, hd], scale = 1/sqrt(hd):
//   S = scale q kᵀ (future keys hidden),  P = softmax(S) per row,  O = P v.
// The composition (nn/attention.h) writes the [T, T] matrices S and P to
// memory; here one query row walks the keys a tile at a time and keeps only
//   m   the largest score seen,  l = sum_j exp(s_j - m),  acc = sum_j exp(s_j - m) v_j
// (the online softmax, Milakov & Gimelshein 2018): when a tile raises the
// max from m to m', the old terms are rescaled by exp(m - m'), so at the end
// O_i = acc / l exactly as softmax would give. What is saved for backward is
// O and one number per row, the log-sum-exp L_i = m + log l, from which any
// P_ij = exp(S_ij - L_i) is rebuilt. Backward (FlashAttention-2's):
//   D_i = dO_i · O_i  (= sum_j P_ij dP_ij),  dP_ij = dO_i · v_j,
//   dS_ij = P_ij (dP_ij - D_i),  dv_j = sum_i P_ij dO_i,
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i.
//
// T is the compute type (float for fp32/bf16/fp16 inputs, double for float64);
// rows are padded to HD (zeros add nothing). Arrays indexed by a loop counter
// stay in registers on the GPU only when the loop is unrolled: LOOM_UNROLL.
#pragma once

#include <cmath>

#include "tensor/kernels/exp.h"
#include "tensor/macros.h"

#if defined(__CUDA_ARCH__)
#define LOOM_UNROLL _Pragma("unroll")
#else
#define LOOM_UNROLL
#endif

namespace loom::kernels::flash {

// Tile sizes: the kernels' and the CPU loop's (tensor/cuda/README.md says why).
constexpr int kRows = 64;       // a block's rows, one thread each: queries (forward, dQ) or keys (dK/dV)
constexpr int kKeyTile = 32;    // keys per K/V tile in shared memory (forward, dQ)
constexpr int kQueryTile = 16;  // queries per Q/dO tile in shared memory (dK/dV)
constexpr int kMaxHeadDim = 64; // q, acc (forward) or q, dO, dq (dQ) in registers: 3 x 64 floats fit, 3 x 128 spill
static_assert(kRows % kKeyTile == 0 && kRows % kQueryTile == 0, "tiles must divide a block");

// a · b over HD elements, in order (a, b: register arrays or shared-memory rows).
template <int HD, class T, class A, class B>
LOOM_HOST_DEVICE T dot(const A& a, const B& b) {
  T s = T(0);
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) s += a[d] * b[d];
  return s;
}

// The scores of query row `query` against the N keys key0.. of a tile
// (k_tile [N][HD]): s_j = scale q · k_j, or -inf where the key is in the
// query's future (key0 + j > query) or past the sequence's end (>= T).
template <int HD, int N, class T, class Q>
LOOM_HOST_DEVICE void score_tile(const Q& q, const T* k_tile, int key0, int query, int T_, T scale, T (&s)[N]) {
  LOOM_UNROLL
  for (int j = 0; j < N; ++j) {
    const int key = key0 + j;
    s[j] = key <= query && key < T_ ? scale * dot<HD, T>(q, k_tile + j * HD) : T(-INFINITY);
  }
}

// Folds a tile's scores s and values v_tile [N][HD] into one row's state:
//   m' = max(m, max_j s_j),  c = exp(m - m'),  p_j = exp(s_j - m'),
//   l' = c l + sum_j p_j,    acc' = c acc + sum_j p_j v_j.
// Start with m = -inf, l = 0, acc = 0: the first tile holds key 0, which every
// query sees, so m is finite after it (c = 1 where m did not move, and on the
// first tile too, where l and acc are 0).
template <int HD, int N, class T, class Acc>
LOOM_HOST_DEVICE void online_softmax_update(const T (&s)[N], const T* v_tile, T& m, T& l, Acc& acc) {
  T m_new = m;
  LOOM_UNROLL
  for (int j = 0; j < N; ++j) m_new = s[j] > m_new ? s[j] : m_new;
  const T c = m_new == m ? T(1) : exp_approx(m - m_new);
  l *= c;
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) acc[d] *= c;
  LOOM_UNROLL
  for (int j = 0; j < N; ++j) {
    const T p = exp_approx(s[j] - m_new);  // exp(-inf) = 0 for hidden keys
    l += p;
    LOOM_UNROLL
    for (int d = 0; d < HD; ++d) acc[d] += p * v_tile[j * HD + d];
  }
  m = m_new;
}

// The end of a row: acc becomes O_i = acc / l; returns L_i = m + log l.
template <int HD, class T, class Acc>
LOOM_HOST_DEVICE T finish_row(T m, T l, Acc& acc) {
  const T inv = T(1) / l;
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) acc[d] *= inv;
  return m + std::log(l);
}

// P_ij rebuilt from the saved log-sum-exp: exp(S_ij - L_i).
template <class T>
LOOM_HOST_DEVICE T attention_weight(T s, T lse) { return exp_approx(s - lse); }

// dS_ij = P_ij (dP_ij - D_i): softmax's backward, with D_i = dO_i · O_i
// standing in for sum_j P_ij dP_ij (the two are equal; D needs one dot per row).
template <class T>
LOOM_HOST_DEVICE T score_grad(T p, T dp, T D) { return p * (dp - D); }

// The dK/dV kernel's step: key `key` (this thread: k_j, v_j; sums dk, dv)
// against query `query` (the tile's current row: q_i, dO_i, L_i, D_i).
//   p = exp(scale q_i·k_j - L_i);  dv_j += p dO_i;  dk_j += dS_ij q_i
// (dk is scaled once at the end). A key in the query's future adds nothing.
template <int HD, class T, class QRow, class KRow, class Acc>
LOOM_HOST_DEVICE void dkdv_step(const QRow& q_i, const QRow& do_i, T L_i, T D_i, int query, const KRow& k_j,
                                const KRow& v_j, int key, T scale, Acc& dk, Acc& dv) {
  if (key > query) return;
  const T p = attention_weight(scale * dot<HD, T>(q_i, k_j), L_i);
  const T ds = score_grad(p, dot<HD, T>(do_i, v_j), D_i);
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) {
    dv[d] += p * do_i[d];
    dk[d] += ds * q_i[d];
  }
}

// The dQ kernel's step: query `query` (this thread: q_i, dO_i, L_i, D_i; sum
// dq) against key `key` (the tile's current row: k_j, v_j).
//   dq_i += dS_ij k_j  (scaled once at the end)
template <int HD, class T, class QRow, class KRow, class Acc>
LOOM_HOST_DEVICE void dq_step(const QRow& q_i, const QRow& do_i, T L_i, T D_i, int query, const KRow& k_j,
                              const KRow& v_j, int key, T scale, Acc& dq) {
  if (key > query) return;
  const T p = attention_weight(scale * dot<HD, T>(q_i, k_j), L_i);
  const T ds = score_grad(p, dot<HD, T>(do_i, v_j), D_i);
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) dq[d] += ds * k_j[d];
}

}  // namespace loom::kernels::flash
