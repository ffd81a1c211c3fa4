// The grad norm's sum of squares over many tensors in a fixed order (issue 44):
// the order the one-reduction kernels (tensor/cuda/fast/grad_norm_multi_tensor.cu)
// add in, as LOOM_HOST_DEVICE pieces the kernels call, and chunked_sum_of_squares,
// the CPU's run of the same pieces in the same order (tests/test_chunk_sum_of_squares.cpp
// holds it to ops::sum_of_squares; the GPU test holds the kernels to it bit for bit).
//
//   pass 1, a block per chunk of the chunk table (kernels/tensor_chunks.h):
//     lane l of `lanes` adds x[l]^2, x[l + lanes]^2, ... of its chunk in double;
//     the lanes meet in a tree (w = lanes/2, lanes/4, ..., 1: lane l < w adds lane l + w)
//     -> partial[chunk]                                            [chunks] float64
//   pass 2, one block: lane l adds partial[l], partial[l + lanes], ...; the same tree -> the sum
//
// Every sum's order depends on the tensors' sizes alone, so the same grads give
// the same bits on every run. The square of a float is exact in double (24-bit
// significands, 48 bits of product), so a fused multiply-add (nvcc's default)
// rounds as the CPU's multiply then add: the CPU model is the GPU's bits.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/kernels/tensor_chunks.h"
#include "tensor/macros.h"

namespace loom::kernels {

// Lane `lane`'s share of x[0, size): x[lane]^2 + x[lane + lanes]^2 + ..., in that order.
LOOM_HOST_DEVICE double lane_sum_of_squares(const float* x, int64_t size, int lane, int lanes) {
  double s = 0;
  for (int64_t i = lane; i < size; i += lanes) {
    const double v = double(x[i]);
    s += v * v;
  }
  return s;
}

// Lane `lane`'s share of the partial sums p[0, n) (pass 2).
LOOM_HOST_DEVICE double lane_sum(const double* p, int64_t n, int lane, int lanes) {
  double s = 0;
  for (int64_t i = lane; i < n; i += lanes) s += p[i];
  return s;
}

// One level of the tree over the lanes' sums s[0, 2w): lane l < w adds lane l + w.
// The kernels run the levels w = lanes/2, ..., 1 with a barrier between them.
LOOM_HOST_DEVICE void tree_level(double* s, int lane, int w) {
  if (lane < w) s[lane] += s[lane + w];
}

// The whole tree on the CPU (lanes a power of two): s[0] at the end.
inline double tree_sum(std::vector<double>& s) {
  for (int w = int(s.size()) / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) tree_level(s.data(), l, w);
  return s[0];
}

// The CPU's run of both passes over tensors x[t] of numels[t] floats, chunks of
// `chunk` elements and blocks of `lanes` lanes (a power of two): the kernels' sum.
inline double chunked_sum_of_squares(const std::vector<const float*>& x, const std::vector<int64_t>& numels,
                                     int64_t chunk, int lanes) {
  LOOM_CHECK(lanes > 0 && (lanes & (lanes - 1)) == 0, "chunked_sum_of_squares: ", lanes, " lanes, a power of two expected");
  LOOM_CHECK(x.size() == numels.size(), "chunked_sum_of_squares: ", x.size(), " tensors, ", numels.size(), " sizes");
  std::vector<double> partial;
  std::vector<double> s(static_cast<size_t>(lanes));
  for (const TensorChunk& c : tensor_chunks(numels, chunk)) {
    for (int l = 0; l < lanes; ++l) s[size_t(l)] = lane_sum_of_squares(x[size_t(c.tensor)] + c.begin, c.size, l, lanes);
    partial.push_back(tree_sum(s));
  }
  for (int l = 0; l < lanes; ++l) s[size_t(l)] = lane_sum(partial.data(), int64_t(partial.size()), l, lanes);
  return tree_sum(s);
}

}  // namespace loom::kernels
