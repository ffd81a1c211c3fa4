// The grad norm's sum of squares over every grad as one reduction (issue 44):
// pass 1, a block per 4096-element chunk of the chunk table (kernels/tensor_chunks.h),
// writes the chunk's sum of squares in double; pass 2, one block, adds the
// partial sums; the host reads the one double. What it does that the reference
// does not: the reference (tensor/ops_optim.cpp's sum_of_squares on a GPU)
// widens each grad to a float64 copy, squares it, sums it and adds the sum to a
// running total: 4 launches and a float64 temporary of 2x the grad's bytes a
// tensor, ~600 launches for a GPT-2 small's ~150 grads. Here: 2 launches, one
// upload of the table, and one read of each grad (fp32 -> double in registers).
// Deterministic: the order of every sum is fixed by the grads' sizes
// (kernels/chunk_sum_of_squares.h, whose CPU run of both passes is these
// kernels' bits); against the reference it differs by float64 rounding
// (~1e-16 relative: another order of the same double adds).
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom::cuda {

// The kernels' chunk and lanes, for the CPU model (kernels::chunked_sum_of_squares).
constexpr int64_t kNormChunk = 4096;
constexpr int kNormLanes = 256;

// sum over the grads of sum(double(g)^2); grads: contiguous fp32 on one GPU
// (0-element ones allowed). The host waits for the result (as the reference).
double sum_of_squares_multi_tensor(const std::vector<Tensor>& grads);

}  // namespace loom::cuda
