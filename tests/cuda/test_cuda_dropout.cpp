// Dropout on the GPU draws the CPU's masks bit for bit: both run the Philox
// words of tensor/kernels/philox.h for (seed, offset, element), so the CPU
// tests of the generator (tests/test_dropout.cpp) cover the GPU's too.
#include "cuda_test.h"

using namespace loom;
using cuda_test::random;

using CudaDropout = cuda_test::CudaTest;

TEST_F(CudaDropout, MaskIsTheCpuMaskForEveryDtypeAndSize) {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4096 * 4 + 3), int64_t(1) << 20}) {  // partial last blocks
      Tensor on_gpu = ops::dropout_mask({n}, dt, gpu, 0.3, 42, 5);
      Tensor on_cpu = ops::dropout_mask({n}, dt, kCPU, 0.3, 42, 5);
      ASSERT_TRUE(on_gpu.device().is_cuda());
      EXPECT_EQ(ops::to(on_gpu, kCPU, kFloat64).to_vector<double>(), ops::to(on_cpu, kFloat64).to_vector<double>())
          << "n = " << n;
    }
  }
}

TEST_F(CudaDropout, OutputAndGeneratorAdvanceAsOnTheCpu) {
  Tensor x = random({3, 5, 17}, 1);
  PhiloxGenerator g_gpu{9}, g_cpu{9};
  for (int call = 0; call < 3; ++call) {
    auto [y_gpu, m_gpu] = ops::dropout(ops::to(x, gpu), 0.1, g_gpu);
    auto [y_cpu, m_cpu] = ops::dropout(x, 0.1, g_cpu);
    EXPECT_EQ(ops::to(y_gpu, kCPU).to_vector<float>(), y_cpu.to_vector<float>()) << "call " << call;
  }
  EXPECT_EQ(g_gpu.offset, 3u);
  EXPECT_EQ(g_cpu.offset, 3u);
}

TEST_F(CudaDropout, StridedInputGetsTheMaskOfItsLogicalElements) {
  Tensor x = ops::transpose(random({6, 10}, 2), 0, 1);  // [10, 6], not contiguous
  PhiloxGenerator g_gpu{3}, g_cpu{3};
  Tensor on_gpu = ops::dropout(ops::transpose(ops::to(random({6, 10}, 2), gpu), 0, 1), 0.5, g_gpu).first;
  EXPECT_EQ(ops::to(on_gpu, kCPU).to_vector<float>(), ops::dropout(x, 0.5, g_cpu).first.to_vector<float>());
}
