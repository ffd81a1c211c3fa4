#include "parallel/expert_parallel/all_to_all.h"

#include "autograd/function.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// The raw exchange: x's row blocks to their ranks, [Σ output_splits, ...] back.
Tensor exchange(const Tensor& x, ProcessGroup& group, const std::vector<int64_t>& output_splits,
                const std::vector<int64_t>& input_splits) {
  Shape shape = x.shape();
  shape[0] = 0;
  for (int64_t n : output_splits) shape[0] += n;
  Tensor out = empty(shape, x.dtype(), x.device());
  group.all_to_all_v(out, ops::contiguous(x), output_splits, input_splits);
  return out;
}

}  // namespace

Tensor all_to_all(const Tensor& x, ProcessGroup& group, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits) {
  return autograd::record("AllToAll", {&x}, exchange(x, group, output_splits, input_splits),
                          [&group, output_splits, input_splits](const autograd::TensorList& g) {
    return autograd::TensorList{exchange(g[0], group, input_splits, output_splits)};  // the splits swapped
  });
}

}  // namespace loom::parallel
