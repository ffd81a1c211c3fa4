// Macros shared by the CPU and (future) CUDA code paths.
// LOOM_HOST_DEVICE marks the per-element and per-row math in tensor/kernels/:
// written once, called from a CPU loop today and from a CUDA kernel later, so
// the CPU tests already cover the GPU math.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOOM_HOST_DEVICE inline
#endif
