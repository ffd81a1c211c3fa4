// Fast embedding backward on the GPU: dW [V, C] += g [N, C] rows at idx [N].
// The reference (embedding.cu) gives each column c one thread that adds all
// N tokens' g[i, c] in token order: C threads (768 for GPT-2), each a chain
// of N = B*T dependent read-modify-writes. Here the vocabulary is cut into
// slices too: thread (c, slice) walks the same tokens in the same order but
// adds only those whose id falls in its slice, so 64x more threads share
// the work and each chain is ~64x shorter.
//
// Why not the two-pass row-block reduction of the layer-norm gradients
// (column_partials.h): an embedding's partial sums are per token id, so one
// block's partial would be a whole [V, C] table (154 MB for GPT-2) or need a
// sort by id. The slices need neither, and keep every dW[t, c]'s sum in
// token order: the reference's and the CPU's bits exactly, on every run,
// with no float atomics.
#include "tensor/cuda/fast/fast_ops.h"
#include "tensor/cuda/launch.cuh"

namespace loom::cuda::fast {
namespace {

constexpr int64_t kVocabSlices = 64;

// blockIdx.y: the slice [t0, t1) of the vocabulary; a column per thread.
__global__ void embedding_backward_kernel(const float* g, const void* idx, bool idx64, float* dw, int64_t N,
                                          int64_t V, int64_t C, int64_t slice, IndexError* error) {
  const int64_t t0 = int64_t(blockIdx.y) * slice, t1 = t0 + slice < V ? t0 + slice : V;
  LOOM_GRID_STRIDE_LOOP(c, C) {
    for (int64_t i = 0; i < N; ++i) {  // every thread of a warp reads the same id: one broadcast load
      const int64_t t = load_index(idx, idx64, i);
      if (t >= t0 && t < t1) dw[t * C + c] += g[i * C + c];
      else if ((t < 0 || t >= V) && blockIdx.y == 0 && c == 0) report_index_error(error, IndexOp::EmbeddingBackward, t, V);
    }
  }
}

}  // namespace

Tensor embedding_backward(const Tensor& grad, const Tensor& idx, int64_t num_rows) {
  const int64_t C = grad.size(-1);
  Tensor g = ops::contiguous(ops::to(grad, kFloat32)), ic = ops::contiguous(idx);
  Tensor out = zeros({num_rows, C}, kFloat32, grad.device());
  if (C > 0 && ic.numel() > 0) {
    DeviceGuard guard(grad.device());
    const int64_t slices = num_rows < 1 ? 1 : num_rows < kVocabSlices ? num_rows : kVocabSlices;
    const int64_t slice = num_rows < 1 ? 1 : (num_rows + slices - 1) / slices;
    const LaunchConfig by_column = launch_config(C);
    embedding_backward_kernel<<<dim3(by_column.blocks, unsigned(slices)), by_column.threads, 0,
                                stream(grad.device())>>>(ptr<float>(g), ic.raw_data(), ic.dtype() == kInt64,
                                                         ptr<float>(out), ic.numel(), num_rows, C, slice,
                                                         index_error_slot(grad.device()));
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(out, grad.dtype());
}

}  // namespace loom::cuda::fast
