// The WebAssembly planner has no tensor library: loom_plan --machine cpu
// measures loom's own GEMM on the CPU it runs on (plan/machine.cpp,
// measure_this_cpu), which a browser cannot do. These are the tensor
// functions that measurement calls, each refusing with the reason; loom_plan
// catches the error and prints it as it prints any other refusal.
#include "tensor/error.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace loom {

namespace {

[[noreturn]] void refuse() {
  throw Error("--machine cpu measures the CPU that runs loom_plan, which the page cannot: choose a datasheet "
              "machine here, or run build/plan/loom_plan --machine cpu on yours");
}

}  // namespace

void Generator::manual_seed(uint64_t) { refuse(); }
Tensor randn(const std::vector<int64_t>&, Generator&, DType, double, double) { refuse(); }
namespace ops {
void set_num_threads(int) { refuse(); }
Tensor matmul(const Tensor&, const Tensor&) { refuse(); }
}  // namespace ops

}  // namespace loom
