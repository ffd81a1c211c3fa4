// Internal to tensor/cuda/fast/: a team of threads shares one row, and sums
// (or max-sums) its values with warp shuffles. What the reference kernels
// (rows.cu) do not: there one thread walks a whole row, so a warp's 32
// threads read 32 different rows (uncoalesced) and a 50257-value row is one
// thread's serial loop. Here
//   WarpTeam  - a warp per row (rows of up to kWarpRowMax values): 8 rows per 256-thread block;
//   BlockTeam - a block of kRowBlockThreads per row (a vocabulary's logits);
// neighbouring threads read neighbouring values (kernels/row_lanes.h), and
// the lanes' partial results meet in a butterfly of __shfl_xor_sync: five
// steps, registers only, every lane ends with the result. A block first
// does that per warp, then once more over the warps' results (shared memory).
// The CPU model of both trees is kernels::team_reduce_model.
#pragma once

#include <cstdint>
#include <type_traits>

#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/online_softmax.h"
#include "tensor/kernels/row_lanes.h"

namespace loom::cuda::fast {

using kernels::kRowBlockThreads;
using kernels::kWarpSize;
using kernels::MaxSum;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpTeamThreads = 256;  // 8 rows per block

// lane ^ offset's value of v (every lane of the warp takes part).
__device__ __forceinline__ float shfl_xor(float v, int offset) { return __shfl_xor_sync(kFullMask, v, offset); }
__device__ __forceinline__ MaxSum<float> shfl_xor(MaxSum<float> v, int offset) {
  return {shfl_xor(v.m, offset), shfl_xor(v.s, offset)};
}

// The butterfly: offsets 16, 8, 4, 2, 1 (kernels::butterfly_all_lanes).
template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, shfl_xor(v, offset));
  return v;
}

// The two merges the kernels reduce with: a sum, and the online softmax's (max, sum) pairs.
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxSumMerge {
  __device__ MaxSum<float> operator()(MaxSum<float> a, MaxSum<float> b) const { return kernels::max_sum_merge(a, b); }
};

struct WarpTeam {
  __device__ int lane() const { return int(threadIdx.x) % kWarpSize; }
  __device__ int lanes() const { return kWarpSize; }
  __device__ int64_t first_row() const { return int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; }
  __device__ int64_t row_stride() const { return int64_t(gridDim.x) * (blockDim.x / kWarpSize); }
  template <class T, class Op>
  __device__ T reduce(T v, Op op, T) const { return warp_reduce(v, op); }
};

struct BlockTeam {
  __device__ int lane() const { return int(threadIdx.x); }
  __device__ int lanes() const { return int(blockDim.x); }
  __device__ int64_t first_row() const { return blockIdx.x; }
  __device__ int64_t row_stride() const { return gridDim.x; }
  // Each warp's tree, warp w's result to slot w, then one tree over the
  // slots (identity past the last warp). blockDim.x: a multiple of 32.
  template <class T, class Op>
  __device__ T reduce(T v, Op op, T identity) const {
    __shared__ T slot[kWarpSize];
    const int lane = int(threadIdx.x) % kWarpSize, warp = int(threadIdx.x) / kWarpSize;
    v = warp_reduce(v, op);
    __syncthreads();  // the previous reduce has read its slots
    if (lane == 0) slot[warp] = v;
    __syncthreads();
    return warp_reduce(lane < int(blockDim.x) / kWarpSize ? slot[lane] : identity, op);
  }
};

// The grid for `rows` rows of n values, and the team that runs them.
struct RowLaunch {
  unsigned blocks, threads;
  bool block_team;
};
inline RowLaunch row_launch(int64_t rows, int64_t n) {
  const bool block = n > kernels::kWarpRowMax;
  const int64_t per_block = block ? 1 : kWarpTeamThreads / kWarpSize;
  int64_t blocks = (rows + per_block - 1) / per_block;
  blocks = blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks;  // the kernels loop over the rest
  return {unsigned(blocks), unsigned(block ? kRowBlockThreads : kWarpTeamThreads), block};
}

// 16-byte loads need every row start aligned: the base pointers and n a multiple of 4.
inline bool can_load_float4(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % 4 != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Calls launch(std::integral_constant<int, Vec>, Team) for the variant that fits.
template <class Launch>
void with_row_variant(const RowLaunch& l, bool float4_ok, Launch launch) {
  using V4 = std::integral_constant<int, 4>;
  using V1 = std::integral_constant<int, 1>;
  if (l.block_team) float4_ok ? launch(V4{}, BlockTeam{}) : launch(V1{}, BlockTeam{});
  else float4_ok ? launch(V4{}, WarpTeam{}) : launch(V1{}, WarpTeam{});
}

}  // namespace loom::cuda::fast
