#include "parallel/comm/process_group.h"

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

bool overlap(const Tensor& a, const Tensor& b) {
  auto* a0 = static_cast<const char*>(a.raw_data());
  auto* b0 = static_cast<const char*>(b.raw_data());
  return a.storage() == b.storage() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace loom::parallel
