// Copies between devices: host -> GPU, GPU -> host, GPU -> GPU. Each moves
// one contiguous block with cudaMemcpyAsync on loom's stream; broadcasting,
// strides and dtype conversion happen on a device on either side, by the
// ordinary copy_ there (the CPU loop or copy.cu's kernel).
//
//   host -> GPU:  src made contiguous on the host, copied up, converted/broadcast on the GPU
//   GPU -> host:  src made contiguous on the GPU, copied down, converted/broadcast on the host
//
// Up: through a pinned staging buffer (pinned.h), so the host does not wait
// for the GPU to catch up and the upload queues behind the step's kernels; the
// source may be freed at once. Down: the copy waits for loom's stream: the
// values must be there when it returns.
#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/pinned.h"

namespace loom::cuda {
namespace {

// dst itself when it is a contiguous block of src's shape and dtype (the
// transfer can land there directly), else a fresh contiguous tensor on dst's device.
Tensor landing_for(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && dst.shape() == src.shape()) return dst;
  return empty(src.shape(), src.dtype(), dst.device());
}

void host_to_device(const Tensor& dst, const Tensor& src) {
  Tensor host = ops::contiguous(src);
  Tensor landing = landing_for(dst, host);
  upload(landing.raw_data(), host.raw_data(), host.nbytes(), dst.device());
  if (!landing.is_same(dst)) copy_on_device(dst, landing);
}

void device_to_host(const Tensor& dst, const Tensor& src) {
  Tensor dev = ops::contiguous(src);  // a kernel on src's GPU when src is strided
  Tensor landing = landing_for(dst, dev);
  DeviceGuard guard(src.device());
  cudaStream_t s = stream(src.device());
  CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), dev.raw_data(), dev.nbytes(), cudaMemcpyDeviceToHost, s));
  enqueue_index_error_copy(src.device());  // rides the same synchronisation
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (!DeferIndexErrors::active()) throw_if_index_error(src.device());
  if (!landing.is_same(dst)) ops::copy_(dst, landing);
}

// Different GPUs: each has its own stream, so the source's stream is finished
// before the peer copy starts, and the copy is finished before `dev` (a
// temporary on the source GPU) can be freed and reused.
void device_to_device(const Tensor& dst, const Tensor& src) {
  Tensor dev = ops::contiguous(src);
  Tensor landing = landing_for(dst, dev);
  synchronize(src.device());
  DeviceGuard guard(dst.device());
  cudaStream_t s = stream(dst.device());
  CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), dst.device().index, dev.raw_data(), src.device().index,
                                 dev.nbytes(), s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  if (!landing.is_same(dst)) copy_on_device(dst, landing);
}

}  // namespace

void copy_(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.device() == src.device()) return copy_on_device(dst, src);
  if (src.device().is_cpu()) return host_to_device(dst, src);
  if (dst.device().is_cpu()) return device_to_host(dst, src);
  device_to_device(dst, src);
}

}  // namespace loom::cuda
