// One output element of index_add (ops_index.cpp) as a sum over a segment:
// with the indices sorted stably by target, target t's sources are the slices
// j = order[begin], ..., order[end - 1] (ascending j), and
//   out[t, k] = Σ_{p = begin}^{end - 1} src[order[p], k]       src: [m, inner]
// added from 0 in that order - the order of the plain loop
// `out[idx[j]] += src[j]` over j = 0, 1, ... - so the CPU loop (ops_index.cpp)
// and the CUDA kernel (cuda/index_add.cu) give the same bits, without atomics.
// MoE's permute backward (each token's k copies) and unpermute's (each slot's
// row) are such sums (nn/moe_token_dispatcher.h).
#pragma once

#include <cstdint>

#include "tensor/macros.h"

namespace loom::kernels {

template <class T>
LOOM_HOST_DEVICE T segment_sum(const T* src, const int64_t* order, int64_t begin, int64_t end, int64_t inner,
                               int64_t k) {
  T acc = T(0);
  for (int64_t p = begin; p < end; ++p) acc += src[order[p] * inner + k];
  return acc;
}

}  // namespace loom::kernels
