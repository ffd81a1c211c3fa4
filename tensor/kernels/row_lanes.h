// How the fast row kernels (tensor/cuda/fast/) split one row over a team of
// `lanes` threads - a warp (32) for rows up to kWarpRowMax values, a whole
// block for longer rows - and in which order each lane adds its values. The
// kernels call these functions; the CPU tests (tests/test_fast_row_math.cpp)
// call the same ones lane by lane, then combine the lanes as the shuffle
// tree does (butterfly_all_lanes), so the GPU's order is tested here.
//
//   row of n values, Vec values a vector (a 16-byte load of 4 floats):
//     lane l takes vectors l, l + lanes, l + 2 lanes, ...   (neighbouring lanes read
//     neighbouring 16 bytes: one 512-byte transaction per warp), each vector's values in order;
//     then the n % Vec leftover values, lane l taking leftover l, l + lanes, ...
#pragma once

#include <cstring>

#include "tensor/macros.h"

namespace loom::kernels {

constexpr int kWarpSize = 32;
constexpr long kWarpRowMax = 1024;  // longer rows get a block each (e.g. a 50257-token vocabulary)
constexpr int kRowBlockThreads = 512;

// Vec consecutive values, aligned so the GPU loads them in one instruction.
template <class T, int Vec>
struct alignas(sizeof(T) * Vec) Pack {
  T v[Vec];
};

template <int Vec, class T>
LOOM_HOST_DEVICE Pack<T, Vec> load_pack(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const Pack<T, Vec>*>(p);  // one ld.global.v4 (p is 16-byte aligned)
#else
  Pack<T, Vec> out;
  std::memcpy(out.v, p, sizeof out.v);
  return out;
#endif
}

// f(i, x[i]) for lane `lane`'s values of the row x[0..n), in the order above.
template <int Vec, class T, class F>
LOOM_HOST_DEVICE void for_lane_values(const T* x, long n, int lane, int lanes, F f) {
  const long vectors = n / Vec;
  for (long v = lane; v < vectors; v += lanes) {
    const Pack<T, Vec> p = load_pack<Vec>(x + v * Vec);
    for (int j = 0; j < Vec; ++j) f(v * Vec + j, p.v[j]);
  }
  for (long i = vectors * Vec + lane; i < n; i += lanes) f(i, x[i]);
}

// The same split over the index only (for writing outputs).
template <int Vec, class F>
LOOM_HOST_DEVICE void for_lane_indices(long n, int lane, int lanes, F f) {
  const long vectors = n / Vec;
  for (long v = lane; v < vectors; v += lanes)
    for (int j = 0; j < Vec; ++j) f(v * Vec + j);
  for (long i = vectors * Vec + lane; i < n; i += lanes) f(i);
}

// The CPU's model of a warp's shuffle tree (tensor/cuda/fast/row_team.cuh): at each
// step, lane l combines its value with lane l ^ offset's, offsets 16, 8, 4,
// 2, 1; after five steps every lane holds the whole warp's result. v[0..32)
// is updated in place, all lanes in lockstep, as the shuffles are.
template <class T, class Op>
void butterfly_all_lanes(T* v, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    T next[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) next[l] = op(v[l], v[l ^ offset]);
    for (int l = 0; l < kWarpSize; ++l) v[l] = next[l];
  }
}

// A team's result as the kernels form it (tensor/cuda/fast/row_team.cuh, BlockTeam::reduce):
// each warp's butterfly, then warp w's result in slot w of 32 (identity in
// the slots past the last warp) and one more butterfly over the slots.
// lane_values[0..lanes), lanes a multiple of 32 and at most 32 * 32.
template <class T, class Op>
T team_reduce_model(const T* lane_values, int lanes, Op op, T identity) {
  T warp[kWarpSize];
  T slot[kWarpSize];
  for (int w = 0; w < kWarpSize; ++w) slot[w] = identity;
  for (int w = 0; w * kWarpSize < lanes; ++w) {
    for (int l = 0; l < kWarpSize; ++l) warp[l] = lane_values[w * kWarpSize + l];
    butterfly_all_lanes(warp, op);
    slot[w] = warp[0];
  }
  if (lanes == kWarpSize) return slot[0];  // a warp per row: no second tree
  butterfly_all_lanes(slot, op);
  return slot[0];
}

}  // namespace loom::kernels
