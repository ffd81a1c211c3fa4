// Internal to tensor/cuda/: uploads from pageable host memory without a host wait.
//
// A cudaMemcpyAsync from pageable memory (loom's CPU tensors are malloc'd)
// first waits for everything queued on the stream - the host stops until the
// GPU has caught up - and then copies through a driver buffer. From pinned
// (page-locked) memory it is a DMA queued like a kernel, and the host goes on
// at once. So an upload (a batch of token ids, the MPI backend's copy up of a
// reduced bucket) first copies its bytes into a pinned buffer on the host,
// then queues the DMA:
//
//   host:    memcpy(pinned, src) | cudaMemcpyAsync(dst, pinned) | record "copied" | returns
//   stream:  ... the step's kernels ...  | DMA | "copied"
//
// The source may be changed or freed as soon as upload() returns; the pinned
// buffer is reused once its "copied" event has completed. cudaHostAlloc pins
// pages (slow, about a millisecond per MB), so buffers are cached per device
// by rounded size (allocator.h's rounding), like the device blocks: after the
// first step no upload pins memory (AllocatorStats::pinned_allocs). PyTorch
// does the same with pin_memory + non_blocking=True and its CachingHostAllocator.
// Uploads above kMaxPinnedUpload (the model's weights, moved once at start)
// keep the pageable path: they would pin that much host memory for good.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/device.h"

namespace loom::cuda {

constexpr size_t kMaxPinnedUpload = size_t(32) << 20;  // 32 MiB

// nbytes from host memory src to device memory dst on d's stream (loom's).
void upload(void* dst, const void* src, size_t nbytes, const Device& d);
// cudaHostAlloc calls made for d's uploads so far.
int64_t pinned_allocs(const Device& d);

}  // namespace loom::cuda
