// The launch counter on the GPU (tensor/cuda/launch_count.h): a toy step of
// known ops, each with the number of launches its CUDA path makes (read off
// tensor/cuda/*: a kernel per `<<<>>>`, a cuBLAS call per GEMM, a memset per
// zero_), counted against the sum. A launch the counter misses (a kernel
// without CUDA_CHECK_LAUNCH, a GEMM not through cublas_gemm or tensor/cuda/fast/gemm_lt.cpp) or counts twice
// fails it. The host side of the counter is tests/test_launch_count.cpp's.
#include "cuda_test.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/cuda/launch_count.h"
#include "tensor/kernels/adamw.h"

using namespace loom;
using cuda_test::random;

using CudaLaunchCount = cuda_test::CudaTest;

TEST_F(CudaLaunchCount, AToyStepLaunchesWhatEachOpPredicts) {
  Tensor x = ops::to(random({4, 8}, 1), gpu), w = ops::to(random({8, 3}, 2), gpu);
  std::vector<Tensor> p, m, v, g;
  for (int64_t n : {24, 1, 0, 7}) {  // a 0-element param launches nothing (optim.cu returns first)
    p.push_back(ops::to(random({n}, 3), gpu));
    m.push_back(zeros({n}, kFloat32, gpu));
    v.push_back(zeros({n}, kFloat32, gpu));
    g.push_back(ops::to(random({n}, 4), gpu));
  }
  const auto s = kernels::adamw_scalars<float>(1e-3, 0.9, 0.95, 1e-8, 0.1, 1);
  cuda::synchronize(gpu);  // the uploads above are transfers: not counted, but nothing may trail into the window

  // The reference path's counts, whatever LOOM_CUDA_KERNELS says (the cuBLASLt path's: test_cuda_gemm_lt.cpp).
  cuda::set_kernel_choice(cuda::KernelChoice::Reference);
  cuda::LaunchWindow window;
  int64_t predicted = 0;
  Tensor y = ops::matmul(x, w);  // fp32, contiguous 2-D: one cuBLAS call (gemm.cpp, cublas_gemm)
  predicted += 1;
  Tensor z = ops::add(y, y);  // one binary_kernel (elementwise.cu)
  predicted += 1;
  ops::zero_(y);  // one cudaMemsetAsync (copy.cu)
  predicted += 1;
  for (size_t i = 0; i < p.size(); ++i) ops::adamw_(p[i], m[i], v[i], g[i], s);  // one adamw_kernel a non-empty param
  predicted += 3;
  Tensor xb = ops::to(x, kBFloat16);  // one copy_kernel converting (copy.cu)
  predicted += 1;
  Tensor yb = ops::matmul(xb, ops::to(w, kBFloat16));  // bf16: w converted (1), both widened to fp32 (2), the GEMM
  predicted += 5;                                      // (1), the fp32 result narrowed (1): gemm.cpp's matmul
  const std::vector<float> host = z.to_vector<float>();  // a transfer: not counted
  cuda::reset_kernel_choice();
  EXPECT_EQ(window.count(), predicted);
  EXPECT_EQ(host.size(), 12u);
  EXPECT_EQ(yb.dtype(), kBFloat16);
}
