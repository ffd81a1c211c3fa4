// Internal to tensor/cuda/*.cu: what every kernel launch needs.
//   - launch_config(n): a 1-D grid of 256-thread blocks; kernels loop with a
//     grid stride, so the grid is capped and any n fits.
//   - Offsets<K>: element offsets of K operands (output first) that share an
//     iteration shape, each with its own strides (0 on broadcast dims): the
//     GPU form of cpu/loops.h's strided_loop. Dims that are contiguous for
//     every operand are merged on the host first, and when every operand is
//     contiguous the kernel uses the linear index itself.
//   - to_compute / from_compute: storage type <-> compute type (float for
//     fp32/bf16/fp16, double for float64), the conversions of kernels/half.h.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"
#include "tensor/tensor.h"

namespace loom::cuda {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;  // after merging; more strided dims than this is refused

struct LaunchConfig {
  unsigned blocks;
  unsigned threads;
};
inline LaunchConfig launch_config(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536;  // grid-stride loops cover the rest
  if (blocks < 1) blocks = 1;
  return {unsigned(blocks), unsigned(kThreads)};
}

// Typed device pointer of a CUDA tensor at element [0, ..., 0].
template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

// Compute type of a storage type: double for float64, float for the rest.
template <class T> struct compute_type { using type = float; };
template <> struct compute_type<double> { using type = double; };
template <class T> using compute_t = typename compute_type<T>::type;

LOOM_HOST_DEVICE float to_compute(float v) { return v; }
LOOM_HOST_DEVICE double to_compute(double v) { return v; }
LOOM_HOST_DEVICE float to_compute(bfloat16 v) { return bf16_to_float(v); }
LOOM_HOST_DEVICE float to_compute(float16 v) { return fp16_to_float(v); }

template <class T, class A>
LOOM_HOST_DEVICE T from_compute(A v) {
  if constexpr (std::is_same_v<T, bfloat16>) return float_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, float16>) return float_to_fp16(float(v));
  else return static_cast<T>(v);
}

template <int K>
struct Offsets {
  int ndim = 0;  // 0: every operand contiguous, offset = linear index
  int64_t size[kMaxDims] = {};
  int64_t stride[K][kMaxDims] = {};

  __device__ __forceinline__ void get(int64_t i, int64_t (&off)[K]) const {
    if (ndim == 0) {
      for (int k = 0; k < K; ++k) off[k] = i;
      return;
    }
    for (int k = 0; k < K; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t id = i % size[d];
      i /= size[d];
      for (int k = 0; k < K; ++k) off[k] += id * stride[k][d];
    }
  }
};

// Strides of t seen as broadcast to shape (0 where t has size 1 or is missing).
inline Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape st(shape.size(), 0);
  const int64_t lead = int64_t(shape.size()) - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i)
    st[size_t(lead + i)] = t.shape()[size_t(i)] == 1 ? 0 : t.strides()[size_t(i)];
  return st;
}

// Host side: merge dims, then fill an Offsets (ndim 0 when all operands are contiguous).
template <int K>
Offsets<K> make_offsets(const char* op, Shape shape, std::array<Shape, K> strides) {
  Offsets<K> o;
  bool contiguous = true;
  const Shape cs = contiguous_strides(shape);
  for (int k = 0; k < K; ++k)
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1 && strides[k][d] != cs[d]) contiguous = false;
  if (contiguous) return o;
  for (int64_t i = int64_t(shape.size()) - 2; i >= 0; --i) {  // merge dim i into i+1 where every operand allows
    bool ok = shape[size_t(i)] == 1;
    if (!ok) {
      ok = true;
      for (int k = 0; k < K; ++k)
        if (strides[k][size_t(i)] != strides[k][size_t(i + 1)] * shape[size_t(i + 1)]) ok = false;
    }
    if (ok) {
      shape[size_t(i + 1)] *= shape[size_t(i)];
      shape.erase(shape.begin() + i);
      for (auto& s : strides) s.erase(s.begin() + i);
    }
  }
  LOOM_CHECK(shape.size() <= size_t(kMaxDims), op, ": ", shape.size(), " strided dims after merging; the CUDA path "
             "handles at most ", kMaxDims, " (call contiguous() first)");
  o.ndim = int(shape.size());
  if (o.ndim == 0) {  // a 0-d tensor: one element at offset 0
    o.ndim = 1;
    o.size[0] = 1;
    return o;
  }
  for (int d = 0; d < o.ndim; ++d) {
    o.size[d] = shape[size_t(d)];
    for (int k = 0; k < K; ++k) o.stride[k][d] = strides[k][size_t(d)];
  }
  return o;
}

// Records the first bad index of a kernel for the host (context.h). The slot
// is device memory, so the claim is an ordinary device atomic; the host sees
// the record when the next synchronisation copies it down.
__device__ __forceinline__ void report_index_error(IndexError* slot, IndexOp op, int64_t index, int64_t limit) {
  auto* word = reinterpret_cast<unsigned long long*>(&slot->op);
  if (atomicCAS(word, 0ull, static_cast<unsigned long long>(op)) == 0ull) {
    slot->index = index;
    slot->limit = limit;
  }
}

// Copies one element of `bytes` bytes (1, 2, 4 or 8).
__device__ __forceinline__ void copy_element(char* dst, const char* src, int bytes) {
  switch (bytes) {
    case 8: *reinterpret_cast<uint64_t*>(dst) = *reinterpret_cast<const uint64_t*>(src); break;
    case 4: *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src); break;
    case 2: *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src); break;
    default: *dst = *src;
  }
}

// Index i of an int32 or int64 index tensor's data.
__device__ __forceinline__ int64_t load_index(const void* idx, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(idx)[i] : int64_t(static_cast<const int32_t*>(idx)[i]);
}

#define LOOM_GRID_STRIDE_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

}  // namespace loom::cuda
