// The all-to-all as an autograd function (_AllToAll in
// Megatron-LM's core/tensor_parallel/mappings.py): rows go to ranks
// in forward, and their gradients come back the same way in backward - the
// reverse all-to-all, the splits swapped:
//   forward   x [Σ input_splits, C]  -> [Σ output_splits, C]   block r of x to rank r
//   backward  g [Σ output_splits, C] -> [Σ input_splits, C]    block r of g back to rank r
// Each row's gradient returns to the rank and the place its row came from,
// because the reverse exchange moves the same blocks the other way.
#pragma once

#include <vector>

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::parallel {

// Collective over group, in forward and in backward.
Tensor all_to_all(const Tensor& x, ProcessGroup& group, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits);

}  // namespace loom::parallel
