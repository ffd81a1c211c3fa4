// One-word checks for every CUDA runtime and cuBLAS call (llm.c's cudaCheck):
// a failure becomes a loom::Error carrying the call, file:line and CUDA's own
// message, e.g.
//   "CUDA error at tensor/cuda/allocator.cpp:61: cudaMalloc(&p, bytes):
//    out of memory (cudaErrorMemoryAllocation)"
// Internal to tensor/ (it includes the CUDA headers); only built with LOOM_CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tensor/cuda/launch_count.h"
#include "tensor/error.h"

namespace loom::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(str("CUDA error at ", file, ":", line, ": ", call, ": ", cudaGetErrorString(err), " (",
                  cudaGetErrorName(err), ")"));
}

// cudaEventQuery, minus a trap: while the work before e is still queued it
// answers cudaErrorNotReady, and the runtime also keeps that as this thread's
// last error, which the next CUDA_CHECK_LAUNCH (cudaGetLastError) would then
// report against an unrelated kernel as "device not ready". It is cleared
// here (PyTorch's CUDAEvent::query does the same). Every event query in loom
// goes through this.
inline cudaError_t query_event(cudaEvent_t e) {
  const cudaError_t r = cudaEventQuery(e);
  if (r == cudaErrorNotReady) (void)cudaGetLastError();
  return r;
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(str("cuBLAS error at ", file, ":", line, ": ", call, ": ", cublasGetStatusString(st), " (",
                  cublasGetStatusName(st), ")"));
}

}  // namespace loom::cuda

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t loom_cuda_err_ = (call);                                                  \
    if (loom_cuda_err_ != cudaSuccess) ::loom::cuda::throw_cuda_error(loom_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    cublasStatus_t loom_cublas_st_ = (call);                                              \
    if (loom_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::loom::cuda::throw_cublas_error(loom_cublas_st_, #call, __FILE__, __LINE__);       \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, at the
// launch that caused them (no synchronisation: errors inside the kernel show
// at the next synchronising call). Every launch passes here once, so this is
// where launches are counted (launch_count.h).
#define CUDA_CHECK_LAUNCH()          \
  do {                               \
    ::loom::cuda::count_launch();    \
    CUDA_CHECK(cudaGetLastError());  \
  } while (0)
