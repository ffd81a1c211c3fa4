// sum_of_squares_multi_tensor (grad_norm_multi_tensor.h): the two passes of
// kernels/chunk_sum_of_squares.h, a block of kThreads lanes each.
#include "tensor/cuda/fast/grad_norm_multi_tensor.h"

#include "tensor/cuda/fast/chunk_table.cuh"
#include "tensor/kernels/chunk_sum_of_squares.h"

namespace loom::cuda {
namespace {

static_assert(kNormLanes == kThreads, "the CPU model's lanes are the block's threads");

// The tree over the block's lane sums in shared memory s[kThreads]; s[0] at the end.
__device__ void block_tree(double* s) {
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    kernels::tree_level(s, int(threadIdx.x), w);
    __syncthreads();
  }
}

// Pass 1: partial[b] = the sum of squares of chunk b.               partial [chunks] float64
__global__ void chunk_sum_of_squares_kernel(const kernels::TensorChunk* chunks, const float* const* x,
                                            double* partial) {
  __shared__ double s[kThreads];
  const kernels::TensorChunk c = chunks[blockIdx.x];
  s[threadIdx.x] = kernels::lane_sum_of_squares(x[c.tensor] + c.begin, c.size, int(threadIdx.x), kThreads);
  block_tree(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

// Pass 2 (one block): *out = the sum of partial[0, n).               out [] float64
__global__ void sum_partials_kernel(const double* partial, int64_t n, double* out) {
  __shared__ double s[kThreads];
  s[threadIdx.x] = kernels::lane_sum(partial, n, int(threadIdx.x), kThreads);
  block_tree(s);
  if (threadIdx.x == 0) *out = s[0];
}

}  // namespace

double sum_of_squares_multi_tensor(const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0;
  const Device d = grads.front().device();
  std::vector<int64_t> numels;
  std::vector<const float*> slots;
  for (const Tensor& g : grads) {
    LOOM_CHECK(g.device() == d && g.dtype() == kFloat32 && g.is_contiguous(), "sum_of_squares_multi_tensor: "
               "gradients must be contiguous fp32 on one device (", d.str(), "), got ", g.describe(), " on ",
               g.device().str());
    numels.push_back(g.numel());
    slots.push_back(g.numel() ? ptr<float>(g) : nullptr);
  }
  LOOM_CHECK(d.is_cuda(), "sum_of_squares_multi_tensor: gradients on ", d.str(), ", a GPU expected");
  const std::vector<kernels::TensorChunk> chunks = kernels::tensor_chunks(numels, kNormChunk);
  if (chunks.empty()) return 0;
  DeviceGuard guard(d);
  ChunkTable t = upload_chunk_table(chunks, slots, 0, d);
  Tensor partial = empty({int64_t(chunks.size())}, kFloat64, d);
  Tensor out = empty({}, kFloat64, d);
  chunk_sum_of_squares_kernel<<<unsigned(chunks.size()), kThreads, 0, stream(d)>>>(
      t.chunks, static_cast<const float* const*>(t.slots), ptr<double>(partial));
  CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads, 0, stream(d)>>>(ptr<double>(partial), int64_t(chunks.size()), ptr<double>(out));
  CUDA_CHECK_LAUNCH();
  return out.item<double>();  // the host waits here, as the reference does
}

}  // namespace loom::cuda
