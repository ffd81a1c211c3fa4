// A model of one warp's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
// for the CPU tests: 32 lanes' registers in, the product out, with the
// fragment layouts transcribed from the PTX ISA's tables ("Matrix Fragments
// for mma.m16n8k16 with floating point type") in their own words, apart from
// tensor/kernels/mma_fragment.h, which is what the tests check against this.
#pragma once

#include <cstdint>

#include "tensor/kernels/mma_fragment.h"

namespace loom::test::warp_model {

constexpr int kLanes = 32;

struct Pos {
  int row, col;
};

// PTX: groupID = %laneid >> 2, threadID_in_group = %laneid % 4; element i of
// a lane's a0..a7, b0..b3, c0..c3.
inline Pos ptx_a(int lane, int i) {
  const int g = lane >> 2, t = lane % 4;
  const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
  const int col = i < 4 ? t * 2 + (i & 0x1) : t * 2 + (i & 0x1) + 8;
  return {row, col};
}
inline Pos ptx_b(int lane, int i) {
  const int g = lane >> 2, t = lane % 4;
  return {i < 2 ? t * 2 + (i & 0x1) : t * 2 + (i & 0x1) + 8, g};
}
inline Pos ptx_c(int lane, int i) {
  const int g = lane >> 2, t = lane % 4;
  return {i < 2 ? g : g + 8, t * 2 + (i & 0x1)};
}

// Element i of a lane's 16-bit fragment registers (two per register, the lower one first).
template <int N>
uint16_t element(const uint32_t (&regs)[N], int i) {
  return uint16_t(i % 2 ? regs[i / 2] >> 16 : regs[i / 2] & 0xffffu);
}

template <class S>
float widen(uint16_t bits) { return kernels::mma::widen_bits<S>(bits); }

// d = a b + d for one warp: each lane's registers as the hardware reads them.
// The sum over k runs in order 0..15 in fp32 (exact products of 16-bit inputs).
template <class S>
void mma(float (&d)[kLanes][4], const uint32_t (&a)[kLanes][4], const uint32_t (&b)[kLanes][2]) {
  float A[16][16], B[16][8], D[16][8];
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < 8; ++i) A[ptx_a(lane, i).row][ptx_a(lane, i).col] = widen<S>(element(a[lane], i));
    for (int i = 0; i < 4; ++i) B[ptx_b(lane, i).row][ptx_b(lane, i).col] = widen<S>(element(b[lane], i));
    for (int i = 0; i < 4; ++i) D[ptx_c(lane, i).row][ptx_c(lane, i).col] = d[lane][i];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float acc = 0.f;
      for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
      D[m][n] += acc;
    }
  for (int lane = 0; lane < kLanes; ++lane)
    for (int i = 0; i < 4; ++i) d[lane][i] = D[ptx_c(lane, i).row][ptx_c(lane, i).col];
}

// The kernel's shuffle reductions over the 4 lanes of a row (xor 1, then xor 2).
inline void group_max(float (&x)[kLanes]) {
  for (int mask : {1, 2}) {
    float y[kLanes];
    for (int l = 0; l < kLanes; ++l) y[l] = x[l ^ mask] > x[l] ? x[l ^ mask] : x[l];
    for (int l = 0; l < kLanes; ++l) x[l] = y[l];
  }
}
inline void group_sum(float (&x)[kLanes]) {
  for (int mask : {1, 2}) {
    float y[kLanes];
    for (int l = 0; l < kLanes; ++l) y[l] = x[l] + x[l ^ mask];
    for (int l = 0; l < kLanes; ++l) x[l] = y[l];
  }
}

}  // namespace loom::test::warp_model
