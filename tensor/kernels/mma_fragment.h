// Which lane of a warp holds which element of one tensor-core instruction's
// operands, mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32:
//   D [16 x 8] = A [16 x 16] B [16 x 8] + C [16 x 8]   (fp32 C, D; 16-bit A, B)
// each of the 32 lanes holding a share in registers (PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type"). Host and device: the
// tensor-core attention (tensor/cuda/fast/flash_attention_mma.cu) loads its
// fragments with these functions, and the CPU tests (tests/test_flash_attention_mma.cpp)
// run them for 32 simulated lanes against a model of the instruction.
//
// lane = 4 g + t: g = lane / 4 its group (0..7), t = lane % 4 its place in the group.
//   A  8 elements, 2 per 32-bit register (the even element in the low half):
//        a[e] = A[g + 8 (e/2 % 2)][2t + e%2 + 8 (e/4)]       registers: rows g, g+8, g, g+8
//   B  4 elements in 2 registers:  b[e] = B[2t + e%2 + 8 (e/2)][g]
//   C, D  4 floats:                c[e] = C[g + 8 (e/2)][2t + e%2]
// Lane 5 (g 1, t 1), for example, holds A[1][2..3], A[9][2..3], A[1][10..11],
// A[9][10..11]; B[2..3][1], B[10..11][1]; C[1][2..3], C[9][2..3].
//
// ".row.col": A is read along its rows and B along its columns, so B = Kᵀ for
// S = Q Kᵀ reads K's rows (two neighbouring elements of a row: one 32-bit
// load), while B = V for O = P V reads down V's columns (two 16-bit loads).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/kernels/half.h"
#include "tensor/macros.h"

#ifndef LOOM_UNROLL  // as tensor/kernels/flash_attention.h defines it
#if defined(__CUDA_ARCH__)
#define LOOM_UNROLL _Pragma("unroll")
#else
#define LOOM_UNROLL
#endif
#endif

namespace loom::kernels::mma {

constexpr int kM = 16, kN = 8, kK = 16;  // the instruction's shape
constexpr int kLanes = 32;

LOOM_HOST_DEVICE int a_row(int lane, int e) { return lane / 4 + 8 * (e / 2 % 2); }
LOOM_HOST_DEVICE int a_col(int lane, int e) { return 2 * (lane % 4) + e % 2 + 8 * (e / 4); }
LOOM_HOST_DEVICE int b_row(int lane, int e) { return 2 * (lane % 4) + e % 2 + 8 * (e / 2); }
LOOM_HOST_DEVICE int b_col(int lane, int /*e*/) { return lane / 4; }
LOOM_HOST_DEVICE int c_row(int lane, int e) { return lane / 4 + 8 * (e / 2); }
LOOM_HOST_DEVICE int c_col(int lane, int e) { return 2 * (lane % 4) + e % 2; }

// Two 16-bit elements in one register, the first in the low half.
LOOM_HOST_DEVICE uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }
LOOM_HOST_DEVICE uint16_t half_of(uint32_t r, int e) { return uint16_t(e % 2 ? r >> 16 : r & 0xffffu); }

// fp32 <-> the 16-bit type S (bfloat16 or float16) as raw bits, rounding to nearest even.
template <class S>
LOOM_HOST_DEVICE uint16_t round_bits(float x) {
  if constexpr (std::is_same_v<S, bfloat16>) return float_to_bf16(x).bits;
  else return float_to_fp16(x).bits;
}
template <class S>
LOOM_HOST_DEVICE float widen_bits(uint16_t b) {
  if constexpr (std::is_same_v<S, bfloat16>) return bf16_to_float(bfloat16{b});
  else return fp16_to_float(float16{b});
}

// Two floats rounded to S (to nearest even) in one register, lo in the low
// half. On the GPU one instruction, cvt.rn.{bf16x2,f16x2}.f32, whose first
// source goes to the high half; on the host round_bits twice. The same bits
// for every number (a NaN may come out with another payload).
template <class S>
LOOM_HOST_DEVICE uint32_t pack_rounded(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (std::is_same_v<S, bfloat16>) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return pack(round_bits<S>(lo), round_bits<S>(hi));
#endif
}

// tile: row-major 16-bit elements, `ld` per row (shared memory in the kernel).
// Elements (r, c) and (r, c + 1) as one register: one 32-bit load (c even, ld even).
LOOM_HOST_DEVICE uint32_t row_pair(const uint16_t* tile, int ld, int r, int c) {
  uint32_t v;
  std::memcpy(&v, tile + r * ld + c, 4);
  return v;
}

// A = the 16 x 16 block at `tile`.
LOOM_HOST_DEVICE void load_a(int lane, const uint16_t* tile, int ld, uint32_t (&a)[4]) {
  LOOM_UNROLL
  for (int r = 0; r < 4; ++r) a[r] = row_pair(tile, ld, a_row(lane, 2 * r), a_col(lane, 2 * r));
}

// B [k][n] = tile[n][k]: the 8 x 16 block at `tile` is Bᵀ (K's rows for S = Q Kᵀ).
LOOM_HOST_DEVICE void load_b_transposed(int lane, const uint16_t* tile, int ld, uint32_t (&b)[2]) {
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) b[r] = row_pair(tile, ld, b_col(lane, 2 * r), b_row(lane, 2 * r));
}

// B [k][n] = tile[k][n]: the 16 x 8 block at `tile` is B (V's rows for O = P V).
LOOM_HOST_DEVICE void load_b(int lane, const uint16_t* tile, int ld, uint32_t (&b)[2]) {
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r)
    b[r] = pack(tile[b_row(lane, 2 * r) * ld + b_col(lane, 2 * r)],
                tile[b_row(lane, 2 * r + 1) * ld + b_col(lane, 2 * r + 1)]);
}

// Two C fragments side by side (columns 0..7 in c0, 8..15 in c1) are, rounded
// to 16 bits, the A fragment of that 16 x 16 block: a lane's C elements sit
// exactly where its A elements do (FlashAttention-2 keeps P in registers this
// way: the scores' result becomes the next product's operand, no shared memory).
//   a[0] = c0[0..1] (row g),  a[1] = c0[2..3] (row g+8),  a[2] = c1[0..1],  a[3] = c1[2..3]
template <class S>
LOOM_HOST_DEVICE void c_pair_to_a(const float (&c0)[4], const float (&c1)[4], uint32_t (&a)[4]) {
  a[0] = pack_rounded<S>(c0[0], c0[1]);
  a[1] = pack_rounded<S>(c0[2], c0[3]);
  a[2] = pack_rounded<S>(c1[0], c1[1]);
  a[3] = pack_rounded<S>(c1[2], c1[3]);
}

}  // namespace loom::kernels::mma
