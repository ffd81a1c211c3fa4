// Internal to tensor/cuda/fast/flash_attention*.cu: moving rows of q, k, v,
// o and their gradients between global memory, shared memory and registers,
// converted to float and padded to HD with zeros (as the CPU loop of
// tensor/ops_flash_attention.cpp does), and the launch's dtype/HD choice.
#pragma once

#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/flash_attention.h"

namespace loom::cuda::flash {

using namespace loom::kernels::flash;

// Rows of a [B, H, T, hd] tensor whose last dim is contiguous.
template <class S>
struct Heads {
  S* p;
  int64_t sb, sh, st;
  __device__ S* row(int b, int h, int t) const { return p + b * sb + h * sh + int64_t(t) * st; }
};
template <class S>
Heads<S> heads_of(const Tensor& x) {
  return {static_cast<S*>(x.raw_data()), x.stride(0), x.stride(1), x.stride(2)};
}

// One thread's row into registers (or its own slot of shared memory). The
// loop is unrolled over HD, so `r` stays in registers; d >= hd reads nothing.
template <int HD, class S, class R>
__device__ __forceinline__ void load_row(R& r, const S* src, bool valid, int hd) {
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) r[d] = valid && d < hd ? to_compute(src[d]) : 0.f;
}

template <int HD, class S, class R>
__device__ __forceinline__ void store_row(S* dst, const R& r, int hd, float factor) {
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d)
    if (d < hd) dst[d] = from_compute<S>(r[d] * factor);
}

// Rows [row0, row0 + N) of one head into a shared tile [N][HD]: the whole
// block loads it together, consecutive threads reading consecutive elements
// of a row (coalesced when hd = HD).
template <int N, int HD, class S>
__device__ __forceinline__ void load_tile(float* tile, const Heads<const S>& x, int b, int h, int row0, int T, int hd) {
  for (int e = threadIdx.x; e < N * HD; e += blockDim.x) {
    const int j = e / HD, d = e % HD;
    tile[e] = row0 + j < T && d < hd ? to_compute(x.row(b, h, row0 + j)[d]) : 0.f;
  }
}

// A row of shared memory read afresh at each use (a volatile load). Without
// it the compiler keeps rows it reads more than once, or in every step of a
// loop, in registers: 64 more per row, and the backward kernels at HD = 64
// spilled (ptxas: 255 registers + 60-164 bytes of local memory).
struct SharedRow {
  const float* p;
  __device__ __forceinline__ float operator[](int d) const { return static_cast<const volatile float*>(p)[d]; }
};

// launch(S{}, std::integral_constant<int, HD>{}) for the dtype and the head size padded to 32 or 64.
template <class F>
void dispatch(DType dtype, int64_t hd, const F& launch) {
  auto by_hd = [&](auto s) {
    if (hd <= 32) launch(s, std::integral_constant<int, 32>{});
    else launch(s, std::integral_constant<int, 64>{});
  };
  switch (dtype) {
    case DType::Float32: by_hd(float{}); break;
    case DType::BFloat16: by_hd(bfloat16{}); break;
    case DType::Float16: by_hd(float16{}); break;
    default: throw Error(str("flash_attention: dtype ", dtype_name(dtype), " has no CUDA kernel"));
  }
}

}  // namespace loom::cuda::flash
