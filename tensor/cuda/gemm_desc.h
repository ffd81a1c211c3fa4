// Internal to tensor/cuda: one GEMM as loom states it (row-major), shared by
// the cuBLAS reference path (gemm.cpp) and the cuBLASLt path
// (fast/gemm_lt.{h,cpp}, fast/gemm_lt_plan.{h,cpp}). Plain C++.
#pragma once

#include <cstdint>

#include "tensor/device.h"
#include "tensor/dtype.h"

namespace loom::cuda {

// batch x [C [M, N] = beta C + op(A) @ op(B)], all row-major with leading dims
// lda/ldb/ldc and element strides between consecutive matrices (0: the same
// matrix for every product, a broadcast operand).
struct Gemm {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  double beta = 0;
};

// One cublasGemmStridedBatchedEx (gemm.cpp): A, B and C all of dtype t
// (float64: fp64 compute; float32: fp32, TF32 only when allowed; bf16/fp16:
// read natively, fp32 accumulation, C rounded once).
void cublas_gemm(const Device& d, DType t, const Gemm& g);

}  // namespace loom::cuda
