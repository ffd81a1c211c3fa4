// ops::index_add on the GPU, deterministic and without a scan per output:
//   out[o, t, k] = sum over j with idx[j] == t of src[o, j, k], j ascending
// 1. keys: the indices as int64 (one out of [0, n) is reported, as the CPU
//    refuses it, and parked at n), values: j = 0 .. m-1;
// 2. a stable radix sort of (key, j) by key (CUB): target t's slices become
//    one segment, still in ascending j;
// 3. offsets[t] = the first sorted key >= t (a binary search per target);
// 4. one thread per output element adds its segment in order
//    (tensor/kernels/segment_sum.h, which the CPU loop calls too).
// So the same terms in the same order as the CPU, the same bits, on every run.
// Work: a radix sort of m keys (a pass per 8 bits or so of n), then
// outer (n + m) inner adds, where the scan was outer n m inner: MoE's permute
// backward sums N K rows into N tokens (N = 8192, K = 2, C = 768: ~10^11 adds
// for the scan, ~10^7 now).
#include <cub/device/device_radix_sort.cuh>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/cuda/launch_count.h"
#include "tensor/kernels/segment_sum.h"

namespace loom::cuda {
namespace {

__global__ void keys_and_slices(const void* idx, bool idx64, int64_t m, int64_t n, int64_t* keys, int64_t* slices,
                                IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(j, m) {
    const int64_t t = load_index(idx, idx64, j);
    if (t < 0 || t >= n) report_index_error(error, IndexOp::IndexAdd, t, n);
    keys[j] = (t < 0 || t >= n) ? n : t;
    slices[j] = j;
  }
}

__global__ void segment_offsets(const int64_t* sorted_keys, int64_t m, int64_t n, int64_t* offsets) {
  LOOM_GRID_STRIDE_LOOP(t, n + 1) {
    int64_t lo = 0, hi = m;  // the first position whose key is >= t
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (sorted_keys[mid] < t) lo = mid + 1;
      else hi = mid;
    }
    offsets[t] = lo;
  }
}

template <class T>
__global__ void segment_sums(const T* src, const int64_t* order, const int64_t* offsets, T* out, int64_t outer,
                             int64_t n, int64_t m, int64_t inner) {
  LOOM_GRID_STRIDE_LOOP(e, outer * n * inner) {
    const int64_t k = e % inner, t = (e / inner) % n, o = e / (inner * n);
    out[e] = kernels::segment_sum(src + o * m * inner, order, offsets[t], offsets[t + 1], inner, k);
  }
}

int key_bits(int64_t n) {  // keys are in [0, n]
  int bits = 1;
  while (bits < 63 && (int64_t(1) << bits) <= n) ++bits;
  return bits;
}

}  // namespace

// Shapes and dims are checked (and dim wrapped) by ops::index_add (ops_index.cpp).
Tensor index_add(const Tensor& like, int64_t dim, const Tensor& idx, const Tensor& src) {
  LOOM_CHECK(idx.dtype() == kInt64 || idx.dtype() == kInt32, "index_add: indices must be int32 or int64, got ",
             idx.describe());
  LOOM_CHECK(src.device() == idx.device(), "index_add: devices differ: ", src.device().str(), " and ",
             idx.device().str());
  LOOM_CHECK(is_floating(src.dtype()), "index_add: expected a floating source, got ", src.describe());
  const Device d = src.device();
  const DType cd = src.dtype() == kFloat64 ? kFloat64 : kFloat32;
  const Shape& shape = like.shape();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= shape[size_t(i)];
  for (size_t i = size_t(dim) + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t n = shape[size_t(dim)], m = idx.numel();
  Tensor s = ops::contiguous(ops::to(src, cd)), ic = ops::contiguous(idx);
  LOOM_CHECK(s.numel() == outer * m * inner, "index_add: source ", src.shape(), " does not match ", m,
             " indices into ", shape);
  Tensor out = empty(shape, cd, d);
  if (out.numel() == 0) return ops::to(out, src.dtype());
  DeviceGuard guard(d);
  cudaStream_t st = stream(d);
  // [m] int64 each: keys and slices, then sorted; [n + 1] offsets
  Tensor keys = empty({m}, kInt64, d), slices = empty({m}, kInt64, d);
  Tensor sorted_keys = empty({m}, kInt64, d), order = empty({m}, kInt64, d), offsets = empty({n + 1}, kInt64, d);
  if (m > 0) {
    LaunchConfig c = launch_config(m);
    keys_and_slices<<<c.blocks, c.threads, 0, st>>>(ic.raw_data(), ic.dtype() == kInt64, m, n, ptr<int64_t>(keys),
                                                    ptr<int64_t>(slices), index_error_slot(d));
    CUDA_CHECK_LAUNCH();
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ptr<int64_t>(keys), ptr<int64_t>(sorted_keys),
                                               ptr<int64_t>(slices), ptr<int64_t>(order), m, 0, key_bits(n), st));
    Tensor temp = empty({int64_t(temp_bytes / 8 + 1)}, kInt64, d);  // CUB's scratch, from the caching allocator
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, ptr<int64_t>(keys),
                                               ptr<int64_t>(sorted_keys), ptr<int64_t>(slices), ptr<int64_t>(order), m,
                                               0, key_bits(n), st));
    count_launch();  // one CUB sort, however many kernels it runs (as one cuBLAS call: launch_count.h)
  }
  LaunchConfig co = launch_config(n + 1);
  segment_offsets<<<co.blocks, co.threads, 0, st>>>(ptr<int64_t>(sorted_keys), m, n, ptr<int64_t>(offsets));
  CUDA_CHECK_LAUNCH();
  LaunchConfig c = launch_config(out.numel());
  LOOM_DISPATCH_COMPUTE(cd, "index_add", {
    segment_sums<<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(s), ptr<int64_t>(order), ptr<int64_t>(offsets),
                                                 ptr<scalar_t>(out), outer, n, m, inner);
  });
  CUDA_CHECK_LAUNCH();
  return ops::to(out, src.dtype());
}

}  // namespace loom::cuda
