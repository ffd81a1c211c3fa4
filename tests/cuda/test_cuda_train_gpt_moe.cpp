// train_gpt --experts on the GPU against the same flags on the CPU, with the
// CPU's parity tolerances (tests/train_gpt_run.h; the runs of tests/moe_runs.h):
// losses, gradient norms and final weights within 1e-5 relative, the routing
// log (balance, drops, busiest expert) equal; save -> resume bit-exact on the
// GPU and within 1e-5 on the CPU; --export-hf equal to the CPU's export. The
// router's top-k, the routing map and the counts run on the host on both
// devices (nn/moe_router.h); permute and unpermute run ops::segment_sum's kernel.
// Skipped, with the reason, without a GPU: none of these has run on a GPU yet.
#include "../moe_runs.h"
#include "cuda_test.h"

using namespace loom;
using namespace loom::test;
using namespace loom::test::moe;

namespace {

const std::string kGpu = " --device cuda ";

class CudaTrainGptMoE : public cuda_test::CudaTest {};

}  // namespace

TEST_F(CudaTrainGptMoE, EveryRoutingOptionMatchesTheCpuRun) {
  for (const std::string& flags : {kMoE, kMoE + kRouting, kMoE + kRouting + "--grad-accum 2 --recompute full "}) {
    SCOPED_TRACE(flags);
    const Result cpu = train("moe_cpu", 1, flags);
    const Result gpu = train("moe_gpu", 1, flags + kGpu);
    expect_same_run(gpu, cpu, "--device cuda");
    expect_same_routing_log(gpu, cpu, "--device cuda");
  }
}

TEST_F(CudaTrainGptMoE, ZeroAndBf16MatchTheCpuRun) {
  const std::string zero = kMoE + kRouting + "--zero 1 ";
  expect_same_run(train("moe_zero_gpu", 1, zero + kGpu), train("moe_zero_cpu", 1, zero), "--zero 1 on the GPU");
  // bf16: each matmul's output rounded to 8 bits after an fp32 sum whose order cuBLAS chooses
  // (test_cuda_train_gpt.cpp's bound for the dense model).
  const std::string bf16 = kMoE + kRouting + "--dtype bf16 ";
  expect_same_run(train("moe_bf16_gpu", 1, bf16 + kGpu), train("moe_bf16_cpu", 1, bf16), "--dtype bf16 on the GPU",
                  2e-2, 2e-2, 2e-2);
}

TEST_F(CudaTrainGptMoE, ResumeIsBitExactOnTheGpuAndTheCheckpointMovesToTheCpu) {
  expect_save_resumes("moe_gpu_resume", kMoE + kRouting, kGpu, "", nullptr, /*ranks=*/1);
  const Result a = train("moe_gpu_twice_a", 1, kMoE + kRouting + kGpu);
  expect_bit_identical(train("moe_gpu_twice_b", 1, kMoE + kRouting + kGpu), a, "the same GPU run twice",
                       "moe_gpu_twice_a");
}

TEST_F(CudaTrainGptMoE, ExportFromTheGpuEqualsTheCpusExport) {
  expect_export_equals_one_process("moe_gpu_export", 1, kGpu, "");
}
