// Reductions on the GPU: the double-precision sums behind sum / mean / sum_to
// (ops_reduce.cpp rounds them to the input dtype, as on the CPU) and max over
// rows.
//
// Deterministic: one block per output value, each of its 256 threads summing
// a fixed subset of the inputs (j = tid, tid + 256, ...), then a tree over the
// 256 partial sums in shared memory in a fixed order. No atomics, so the same
// input gives the same bits on every run (bit-exact resume on GPU needs that).
//
//   x viewed as [rows, inner] = [kept dims..., reduced dims...] (a permuted
//   view, read through its strides, never copied) -> out [rows] float64
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"

namespace loom::cuda {
namespace {

template <class T>
__global__ void sum_rows_kernel(const T* x, Offsets<1> ix, int64_t rows, int64_t inner, double* out) {
  __shared__ double partial[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < inner; j += kThreads) {
      int64_t o[1];
      ix.get(r * inner + j, o);
      s += double(to_compute(x[o[0]]));
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (int(threadIdx.x) < w) partial[threadIdx.x] += partial[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = partial[0];
    __syncthreads();  // partial[] is rewritten for the next row
  }
}

// One thread per row of [rows, n]: the first maximum, as the CPU loop finds it.
template <class T>
__global__ void max_rows_kernel(const T* x, int64_t rows, int64_t n, T* values, int64_t* indices) {
  LOOM_GRID_STRIDE_LOOP(r, rows) {
    const T* row = x + r * n;
    int64_t best = 0;
    auto bv = to_compute(row[0]);
    for (int64_t i = 1; i < n; ++i) {
      auto v = to_compute(row[i]);
      if (v > bv) {
        bv = v;
        best = i;
      }
    }
    values[r] = row[best];
    indices[r] = best;
  }
}

}  // namespace

Tensor sum_in_double(const Tensor& x, const std::vector<bool>& reduced) {
  Shape keep_shape = x.shape();
  std::vector<int64_t> perm, reduced_dims;
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[size_t(d)]) {
      reduced_dims.push_back(d);
      inner *= x.shape()[size_t(d)];
      keep_shape[size_t(d)] = 1;
    } else {
      perm.push_back(d);
      rows *= x.shape()[size_t(d)];
    }
  }
  perm.insert(perm.end(), reduced_dims.begin(), reduced_dims.end());
  Tensor xp = ops::permute(x, perm);
  Tensor out = empty(keep_shape, kFloat64, x.device());
  if (rows == 0) return out;
  DeviceGuard guard(x.device());
  auto ix = make_offsets<1>("sum", xp.shape(), {xp.strides()});
  const unsigned blocks = unsigned(rows < 65536 ? rows : 65536);
  cudaStream_t st = stream(x.device());
  LOOM_DISPATCH_FLOAT(x.dtype(), "sum", {
    sum_rows_kernel<scalar_t><<<blocks, kThreads, 0, st>>>(ptr<scalar_t>(x), ix, rows, inner, ptr<double>(out));
  });
  CUDA_CHECK_LAUNCH();
  return out;
}

void max_rows(const Tensor& rows, const Tensor& values, const Tensor& indices) {
  const int64_t R = rows.size(0), n = rows.size(1);
  if (R == 0) return;
  DeviceGuard guard(rows.device());
  LaunchConfig c = launch_config(R);
  cudaStream_t st = stream(rows.device());
  LOOM_DISPATCH_FLOAT(rows.dtype(), "max", {
    max_rows_kernel<scalar_t><<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(rows), R, n, ptr<scalar_t>(values),
                                                               ptr<int64_t>(indices));
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
