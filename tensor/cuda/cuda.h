// The CUDA backend's public switches and counters (a CUDA build only; each
// function throws "loom was built without CUDA" in a build without it).
// Tensors reach the GPU through the ordinary API: empty(shape, dtype, "cuda:0"),
// ops::to(t, Device("cuda")), and every op dispatches on its inputs' device.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/device.h"

namespace loom::cuda {

// GPUs the CUDA runtime sees (0 without a GPU or driver; never throws).
int device_count();
bool is_available();
// Why no GPU can be used ("" when one can): the runtime's answer
// ("cudaGetDeviceCount: no CUDA-capable device is detected (cudaErrorNoDevice)"),
// or that this build has no CUDA. For messages such as train_gpt's --device check.
std::string unavailable_reason();

// Waits until everything loom enqueued on d's stream has finished. Copies to
// the CPU and .item() do this themselves; benchmarks call it before a clock.
void synchronize(const Device& d);

// TF32 tensor-core GEMMs (10-bit mantissa inputs, fp32 accumulation): faster,
// but a GPU run then no longer matches the CPU run. Off by default (--tf32).
void set_allow_tf32(bool allow);
bool allow_tf32();

// The caching allocator's own counters for one device (tensor/cuda/allocator.h).
// Live and peak tensor bytes are memory_stats(d), as for the CPU.
struct AllocatorStats {
  int64_t reserved_bytes = 0;  // held from cudaMalloc: live blocks + cached free blocks
  int64_t cached_bytes = 0;    // free blocks kept for reuse
  int64_t device_allocs = 0;   // cudaMalloc calls so far (flat in a steady-state step)
  int64_t device_frees = 0;    // cudaFree calls so far (only empty_cache and out-of-memory retries)
  int64_t pinned_allocs = 0;   // cudaHostAlloc calls for uploads' staging (flat in a steady-state step)
};
AllocatorStats allocator_stats(const Device& d);
// Gives every cached free block of d back to the driver (cudaFree).
void empty_cache(const Device& d);

}  // namespace loom::cuda
