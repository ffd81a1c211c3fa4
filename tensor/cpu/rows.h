// Internal to tensor/: what the CPU row ops (ops_nn.cpp, ops_loss.cpp) do to
// their inputs before a per-row kernel runs: rows in the compute dtype, and
// token ids read as int64 whatever their int dtype.
#pragma once

#include <cstdint>

#include "tensor/ops.h"

namespace loom::cpu {

// float64 stays double; everything else is computed in fp32.
inline DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// Contiguous copy of x in its compute dtype (x itself when it already is one).
inline Tensor rows_of(const char* op, const Tensor& x) {
  check_device_supported(op, x.device());
  LOOM_CHECK(is_floating(x.dtype()), op, ": expected a floating tensor, got ", x.describe());
  LOOM_CHECK(x.dim() >= 1, op, ": expected at least 1 dim, got a scalar");
  return ops::contiguous(ops::to(x, compute_dtype(x.dtype())));
}

// Element i of a contiguous int32 or int64 index tensor.
inline int64_t index_at(const Tensor& idx, int64_t i) {
  return idx.dtype() == kInt64 ? idx.data<int64_t>()[i] : int64_t(idx.data<int32_t>()[i]);
}

inline void check_indices(const char* op, const Tensor& idx) {
  LOOM_CHECK(idx.dtype() == kInt64 || idx.dtype() == kInt32, op, ": indices must be int32 or int64, got ",
             idx.describe());
}

}  // namespace loom::cpu
