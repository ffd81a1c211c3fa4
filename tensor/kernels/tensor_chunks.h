// The chunk table of a multi-tensor launch (PyTorch's multi_tensor_apply,
// apex's multi_tensor_adam): many tensors, one kernel. Each tensor is cut into
// chunks of at most `chunk` elements and block b of the grid works on chunk b:
// elements [begin, begin + size) of tensor `tensor`. Host code, plain C++ (the
// GPU reads the table as an array of these PODs; tests/test_tensor_chunks.cpp
// checks it on the CPU).
//
//   numels {5, 0, 3}, chunk 4  ->  {t0 [0, 4)} {t0 [4, 5)} {t2 [0, 3)}
//
// Every element of every tensor lies in exactly one chunk, in tensor order
// then element order; a 0-element tensor has none. The chunks stay within one
// tensor, so a block needs one row of the pointer table and no search.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/error.h"

namespace loom::kernels {

struct TensorChunk {
  int32_t tensor;  // index into the launch's per-tensor arrays (pointers, scalars)
  int32_t size;    // elements in this chunk, 1..chunk
  int64_t begin;   // first element, within the tensor
};

inline std::vector<TensorChunk> tensor_chunks(const std::vector<int64_t>& numels, int64_t chunk) {
  LOOM_CHECK(chunk > 0 && chunk <= INT32_MAX, "tensor_chunks: chunk size ", chunk, " must be in [1, 2^31)");
  LOOM_CHECK(numels.size() <= size_t(INT32_MAX), "tensor_chunks: ", numels.size(), " tensors");
  std::vector<TensorChunk> out;
  for (size_t t = 0; t < numels.size(); ++t) {
    LOOM_CHECK(numels[t] >= 0, "tensor_chunks: tensor ", t, " has ", numels[t], " elements");
    for (int64_t b = 0; b < numels[t]; b += chunk)
      out.push_back({int32_t(t), int32_t(numels[t] - b < chunk ? numels[t] - b : chunk), b});
  }
  return out;
}

}  // namespace loom::kernels
