// The tensor-core flash attention backward's per-lane math (FlashAttention-2's
// backward, Dao 2023, split in two passes as the CUDA-core reference is),
// written once for the CUDA kernels (tensor/cuda/fast/flash_attention_mma_backward.cu)
// and the CPU simulation of their warps (tests/test_flash_attention_mma_backward.cpp).
// The formulas are tensor/kernels/flash_attention.h's:
//   P = exp(scale S - L),  dP = dO Vᵀ,  dS = P ∘ (dP - D),  D_i = dO_i · O_i,
//   dV = Pᵀ dO,  dK = scale dSᵀ Q,  dQ = scale dS K.
//
// A block is 4 warps of 16 rows each (flash_attention_mma.h's kWarps,
// kWarpRows); a warp takes the other side's rows 16 at a time (one chunk:
// an mma's K), so each product below is one 16 x 16 block of scores.
//   dK/dV pass: a warp owns 16 keys and computes the scores transposed,
//     Sᵀ [16 keys x 16 queries] = K Qᵀ   (A = K's rows, B = Qᵀ: Q's rows, as S = Q Kᵀ reads K's)
//     dPᵀ [16 x 16] = V dOᵀ              (A = V's rows, B = dOᵀ)
//     then Pᵀ, dSᵀ (key_rows_grads below) become A fragments in place
//     (mma::c_pair_to_a), and dV += Pᵀ dO, dK += dSᵀ Q read dO's and Q's
//     rows as B (mma::load_b, as O += P V reads V's).
//   dQ pass: a warp owns 16 queries: S = Q Kᵀ and dP = dO Vᵀ as the forward's
//     S, then dS (query_rows_grads) as A, and dQ += dS K (B = K's rows).
// Computing Sᵀ rather than S is what makes every operand one of the forward's
// three loads: Pᵀ and dSᵀ come out of the instruction already in the A
// layout, so no transposed fragment is ever built.
//
// P and dS are fp32 until they become operands, then rounded to bf16/fp16
// (the reference keeps them fp32): the products' inputs are 16-bit, their
// sums fp32.
#pragma once

#include <cstdint>

#include "tensor/kernels/exp.h"
#include "tensor/kernels/flash_attention_mma.h"
#include "tensor/kernels/mma_fragment.h"

namespace loom::kernels::flash_mma {

constexpr int kChunk = mma::kK;  // the other side's rows per product: 16

// Queries per Q/dO tile of the dK/dV pass (shared memory: K, V [64][HD + 8]
// and Q, dO [kQueryRows][HD + 8] 16-bit, under the 48 KiB of a static
// allocation: 36.5 KiB at HD 64, 42.6 KiB at HD 128).
template <int HD>
constexpr int kQueryRows = HD <= 64 ? 64 : 16;

// One element of a 16 x 16 block: s = the raw score q·k, dp = dO·v. Becomes
// p = exp(scale s - L) and ds = p (dp - D), both 0 where the key is hidden.
LOOM_HOST_DEVICE void score_and_grad(float& s, float& dp, float scale, float L, float D, bool visible) {
  const float p = visible ? exp_approx(scale * s - L) : 0.f;
  dp = p * (dp - D);
  s = p;
}

// dQ pass. s, dp [2][4]: C fragments of S and dP for the warp's 16 queries
// (rows row0..) and 16 keys key0.. (fragment j: keys key0 + 8j..). L, D: this
// lane's two rows' (g and g + 8). A key is hidden in a row's future and at or
// past T. After: s = P, dp = dS.
LOOM_HOST_DEVICE void query_rows_grads(int lane, float (&s)[2][4], float (&dp)[2][4], float scale, int row0,
                                       int key0, int T, const float (&L)[2], const float (&D)[2]) {
  LOOM_UNROLL
  for (int j = 0; j < 2; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + mma::c_row(lane, e), key = key0 + mma::kN * j + mma::c_col(lane, e);
      score_and_grad(s[j][e], dp[j][e], scale, L[e / 2], D[e / 2], key <= row && key < T);
    }
}

// dK/dV pass. s, dp [2][4]: C fragments of Sᵀ and dPᵀ for the warp's 16 keys
// (rows key_row0..) and 16 queries query0.. (fragment j: queries query0 +
// 8j..). L, D: the 16 queries' (shared memory, indexed from query0). A query
// sees the key when it is not in its past and is before T. After: s = Pᵀ, dp = dSᵀ.
LOOM_HOST_DEVICE void key_rows_grads(int lane, float (&s)[2][4], float (&dp)[2][4], float scale, int key_row0,
                                     int query0, int T, const float* L, const float* D) {
  LOOM_UNROLL
  for (int j = 0; j < 2; ++j)
    LOOM_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int i = mma::kN * j + mma::c_col(lane, e), key = key_row0 + mma::c_row(lane, e), query = query0 + i;
      score_and_grad(s[j][e], dp[j][e], scale, L[i], D[i], key <= query && query < T);
    }
}

// D_i = dO_i · O_i over HD 16-bit elements, in order, in fp32 (the reference's
// flash_row_dot_kernel adds the same products in the same order).
template <int HD, class S>
LOOM_HOST_DEVICE float row_dot_bits(const uint16_t* dO, const uint16_t* o) {
  float sum = 0.f;
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) sum += mma::widen_bits<S>(dO[d]) * mma::widen_bits<S>(o[d]);
  return sum;
}

}  // namespace loom::kernels::flash_mma
