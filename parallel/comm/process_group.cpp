#include "parallel/comm/process_group.h"

#include <algorithm>

namespace loom::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

void check_reduce_op(const char* op, const Tensor& t, ReduceOp r) {
  LOOM_CHECK(r != ReduceOp::Avg || is_floating(t.dtype()), op, ": ReduceOp::Avg needs a floating dtype, got ",
             t.describe());
}

void check_reduce_scatter_shapes(const Tensor& output, const Tensor& input, int size) {
  LOOM_CHECK(input.dtype() == output.dtype(), "reduce_scatter: input ", input.describe(), " and output ",
             output.describe(), " differ in dtype");
  LOOM_CHECK(input.numel() == int64_t(size) * output.numel(), "reduce_scatter: input of ", input.numel(),
             " elements is not ", size, " ranks x output of ", output.numel(),
             " elements (pad the input to a multiple of the group size)");
}

void check_all_gather_shapes(const Tensor& output, const Tensor& input, int size) {
  LOOM_CHECK(input.dtype() == output.dtype(), "all_gather: input ", input.describe(), " and output ",
             output.describe(), " differ in dtype");
  LOOM_CHECK(output.numel() == int64_t(size) * input.numel(), "all_gather: output of ", output.numel(),
             " elements is not ", size, " ranks x input of ", input.numel(), " elements");
}

std::shared_ptr<Work> ProcessGroup::all_to_all_v_async(const Tensor&, const Tensor&, const std::vector<int64_t>&,
                                                     const std::vector<int64_t>&) {
  throw Error(str("all_to_all_v: group ", name(), " does not implement it"));
}

void check_all_to_all_shapes(const Tensor& output, const Tensor& input, const std::vector<int64_t>& output_splits,
                             const std::vector<int64_t>& input_splits, int size) {
  LOOM_CHECK(input.dtype() == output.dtype(), "all_to_all_v: input ", input.describe(), " and output ",
             output.describe(), " differ in dtype");
  // The row shape (every dim but the first) must match; either may have no rows.
  LOOM_CHECK(input.dim() >= 1 && input.dim() == output.dim() &&
                 std::equal(input.shape().begin() + 1, input.shape().end(), output.shape().begin() + 1),
             "all_to_all_v: input ", input.describe(), " and output ", output.describe(), " differ in row shape");
  for (const auto* splits : {&input_splits, &output_splits}) {
    const bool in = splits == &input_splits;
    LOOM_CHECK(int(splits->size()) == size, "all_to_all_v: ", splits->size(), in ? " input" : " output",
               " splits for a group of ", size, " ranks");
    int64_t rows = 0;
    for (int64_t n : *splits) {
      LOOM_CHECK(n >= 0, "all_to_all_v: a negative split, ", n);
      rows += n;
    }
    const Tensor& t = in ? input : output;
    LOOM_CHECK(rows == t.size(0), "all_to_all_v: the ", in ? "input" : "output", " splits sum to ", rows,
               " rows, the ", in ? "input " : "output ", t.describe(), " has ", t.size(0));
  }
}

bool overlap(const Tensor& a, const Tensor& b) {
  auto* a0 = static_cast<const char*>(a.raw_data());
  auto* b0 = static_cast<const char*>(b.raw_data());
  return a.storage() == b.storage() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace loom::parallel
