// Dropout's scale mask on the GPU: the same Philox4x32-10 words
// (tensor/kernels/philox.h) and the same keep test as the CPU loop in
// tensor/ops_dropout.cpp, one thread per block of 4 elements, so a GPU run
// draws the CPU run's masks bit for bit.
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/philox.h"

namespace loom::cuda {
namespace {

// m: [n] contiguous; element i keeps word i % 4 of block i / 4 of call (seed, offset).
template <class T>
__global__ void dropout_mask_kernel(T* m, int64_t n, uint64_t seed, uint64_t offset, uint32_t threshold, T keep,
                                    T drop) {
  const int64_t blocks = (n + 3) / 4;
  LOOM_GRID_STRIDE_LOOP(b, blocks) {
    const kernels::Philox4 r = kernels::philox_block(seed, offset, uint64_t(b));
    for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j)
      m[4 * b + j] = kernels::dropout_keeps(r.w[j], threshold) ? keep : drop;
  }
}

template <class T>
void launch(const Tensor& mask, uint64_t seed, uint64_t offset, uint32_t threshold, double scale) {
  const int64_t n = mask.numel();
  LaunchConfig c = launch_config((n + 3) / 4);
  // keep and drop are rounded on the host as the CPU loop rounds them (double -> float -> storage type).
  const T keep = from_compute<T>(compute_t<T>(scale)), drop = from_compute<T>(compute_t<T>(0));
  dropout_mask_kernel<T><<<c.blocks, c.threads, 0, stream(mask.device())>>>(ptr<T>(mask), n, seed, offset, threshold,
                                                                           keep, drop);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void dropout_mask(const Tensor& mask, uint64_t seed, uint64_t offset, uint32_t threshold, double scale) {
  LOOM_CHECK(mask.is_contiguous(), "dropout: the mask must be contiguous, got ", mask.describe());
  if (mask.numel() == 0) return;
  DeviceGuard guard(mask.device());
  switch (mask.dtype()) {
    case DType::Float32: return launch<float>(mask, seed, offset, threshold, scale);
    case DType::Float64: return launch<double>(mask, seed, offset, threshold, scale);
    case DType::BFloat16: return launch<bfloat16>(mask, seed, offset, threshold, scale);
    case DType::Float16: return launch<float16>(mask, seed, offset, threshold, scale);
    default: throw Error(str("dropout: expected a floating tensor, got ", mask.describe()));
  }
}

}  // namespace loom::cuda
