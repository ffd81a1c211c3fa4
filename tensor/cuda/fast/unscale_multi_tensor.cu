// unscale_multi_tensor / scale_multi_tensor (unscale_multi_tensor.h): a block
// per chunk of the chunk table, the grads' pointers beside it in one upload.
#include "tensor/cuda/fast/unscale_multi_tensor.h"

#include "tensor/cuda/fast/chunk_table.cuh"
#include "tensor/kernels/unscale.h"
#include "tensor/ops.h"

namespace loom::cuda {
namespace {

constexpr int64_t kChunk = 16 * kThreads;  // as adamw_multi_tensor.cu: 16 elements a thread

// g <- g * factor over chunk blockIdx.x; *found_inf = 1 where an element was
// not finite (found_inf null: clipping, nothing to note).
__global__ void scale_multi_tensor_kernel(const kernels::TensorChunk* chunks, float* const* grads, float factor,
                                          int32_t* found_inf) {
  const kernels::TensorChunk c = chunks[blockIdx.x];
  float* g = grads[c.tensor] + c.begin;
  bool bad = false;
  for (int i = int(threadIdx.x); i < c.size; i += int(blockDim.x))  // coalesced: neighbours read neighbours
    bad |= kernels::unscale_and_check(g[i], factor);  // unscale_kernel's math (mul_'s: x * float(s))
  if (bad && found_inf) *found_inf = 1;
}

// Launches the kernel over grads; returns the table (its tail: the flag) or an empty one when there is no work.
ChunkTable launch(const std::vector<Tensor>& grads, double factor, bool check, const char* what) {
  if (grads.empty()) return {};
  const Device d = grads.front().device();
  std::vector<int64_t> numels;
  std::vector<float*> slots;
  for (const Tensor& g : grads) {
    LOOM_CHECK(g.device() == d && g.dtype() == kFloat32 && g.is_contiguous(), what, ": gradients must be "
               "contiguous fp32 on one device (", d.str(), "), got ", g.describe(), " on ", g.device().str());
    numels.push_back(g.numel());
    slots.push_back(g.numel() ? ptr<float>(g) : nullptr);
  }
  LOOM_CHECK(d.is_cuda(), what, ": gradients on ", d.str(), ", a GPU expected");
  const std::vector<kernels::TensorChunk> chunks = kernels::tensor_chunks(numels, kChunk);
  if (chunks.empty()) return {};
  DeviceGuard guard(d);
  ChunkTable t = upload_chunk_table(chunks, slots, sizeof(int32_t), d);
  int32_t* flag = check ? static_cast<int32_t*>(t.buffer.raw_data()) + t.tail_index : nullptr;
  scale_multi_tensor_kernel<<<unsigned(chunks.size()), kThreads, 0, stream(d)>>>(
      t.chunks, static_cast<float* const*>(t.slots), float(factor), flag);
  CUDA_CHECK_LAUNCH();
  return t;
}

}  // namespace

bool unscale_multi_tensor(const std::vector<Tensor>& grads, double inv_scale) {
  ChunkTable t = launch(grads, inv_scale, true, "unscale_multi_tensor");
  if (!t.buffer.defined()) return false;
  return ops::narrow(t.buffer, 0, t.tail_index, 1).item<int64_t>() != 0;  // the host waits here, as the reference
}

void scale_multi_tensor(const std::vector<Tensor>& grads, double factor) {
  launch(grads, factor, false, "scale_multi_tensor");
}

}  // namespace loom::cuda
