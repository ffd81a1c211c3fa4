// The one-launch AdamW (tensor/cuda/fast/adamw_multi_tensor.h) against the
// reference kernel, a launch per param (tensor/cuda/optim.cu): the same bits
// for params of 0, 1, odd and chunk-boundary sizes in fp32, bf16 and fp16,
// each with its own lr and weight decay, over three steps; one launch against
// one a param; and optim::adamw_updates (what MixedPrecisionOptimizer calls)
// taking that path under LOOM_CUDA_KERNELS=fast with the same results.
// The chunk table itself is tests/test_tensor_chunks.cpp's (CPU).
#include "cuda_test.h"
#include "optim/adamw_updates.h"
#include "tensor/cuda/fast/adamw_multi_tensor.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/cuda/launch_count.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;

using CudaOptimMultiTensor = cuda_test::CudaTest;

namespace {

// 4096 is the kernel's chunk (16 x 256): one below, at, one above, and two chunks and a bit.
const std::vector<int64_t> kSizes = {0, 1, 7, 4095, 4096, 4097, 2 * 4096 + 3};

struct Params {
  std::vector<Tensor> p, m, v;
};

Params make(DType dt, const Device& gpu) {
  Params out;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    out.p.push_back(ops::to(random({kSizes[i]}, 100 + i), gpu, dt));
    out.m.push_back(zeros({kSizes[i]}, kFloat32, gpu));
    out.v.push_back(zeros({kSizes[i]}, kFloat32, gpu));
  }
  return out;
}

}  // namespace

TEST_F(CudaOptimMultiTensor, OneLaunchGivesTheReferenceKernelsBits) {
  for (DType dt : {kFloat32, kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Params ref = make(dt, gpu), one = make(dt, gpu);
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<Tensor> g;
      std::vector<kernels::AdamWScalars<float>> s;
      for (size_t i = 0; i < kSizes.size(); ++i) {
        g.push_back(ops::to(random({kSizes[i]}, 1000 * uint64_t(step) + i), gpu));
        s.push_back(kernels::adamw_scalars<float>(1e-2 * double(i + 1), 0.9, 0.95, 1e-8, 0.01 * double(i), step));
      }
      cuda::LaunchWindow per_param;
      for (size_t i = 0; i < kSizes.size(); ++i) ops::adamw_(ref.p[i], ref.m[i], ref.v[i], g[i], s[i]);
      EXPECT_EQ(per_param.count(), int64_t(kSizes.size()) - 1);  // the 0-element param launches nothing
      cuda::LaunchWindow multi;
      cuda::adamw_multi_tensor(one.p, one.m, one.v, g, s);
      EXPECT_EQ(multi.count(), 1);
    }
    for (size_t i = 0; i < kSizes.size(); ++i) {
      SCOPED_TRACE(kSizes[i]);
      expect_close(one.p[i], ops::to(ref.p[i], kCPU), 0, 0);  // bit for bit
      expect_close(one.m[i], ops::to(ref.m[i], kCPU), 0, 0);
      expect_close(one.v[i], ops::to(ref.v[i], kCPU), 0, 0);
    }
  }
}

TEST_F(CudaOptimMultiTensor, RefusesMixedDtypesAndWrongSizes) {
  Params a = make(kFloat32, gpu);
  std::vector<Tensor> g;
  std::vector<kernels::AdamWScalars<float>> s(kSizes.size(), kernels::adamw_scalars<float>(1e-3, 0.9, 0.95, 1e-8, 0, 1));
  for (int64_t n : kSizes) g.push_back(zeros({n}, kFloat32, gpu));
  a.p[2] = ops::to(a.p[2], kBFloat16);
  EXPECT_THROW(cuda::adamw_multi_tensor(a.p, a.m, a.v, g, s), Error);
  a.p[2] = ops::to(a.p[2], kFloat32);
  g[3] = zeros({kSizes[3] + 1}, kFloat32, gpu);
  EXPECT_THROW(cuda::adamw_multi_tensor(a.p, a.m, a.v, g, s), Error);
}

TEST_F(CudaOptimMultiTensor, AdamWUpdatesTakesOneLaunchUnderFastKernels) {
  optim::AdamWOptions o;
  std::vector<optim::AdamWState> ref_state, fast_state;
  Params ref = make(kFloat32, gpu), fast = make(kFloat32, gpu);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    ref_state.push_back({zeros({}, kInt64), ref.m[i], ref.v[i]});
    fast_state.push_back({zeros({}, kInt64), fast.m[i], fast.v[i]});
  }
  for (int step = 0; step < 2; ++step) {
    std::vector<optim::AdamWUpdate> ref_updates, fast_updates;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      Tensor g = ops::to(random({kSizes[i]}, 77 + uint64_t(step) * 31 + i), gpu);
      ref_updates.push_back({ref.p[i], &ref_state[i], g, 1e-2, 0.1 * double(i % 2)});
      fast_updates.push_back({fast.p[i], &fast_state[i], g, 1e-2, 0.1 * double(i % 2)});
    }
    cuda::set_kernel_choice(cuda::KernelChoice::Reference);
    optim::adamw_updates(ref_updates, o);
    cuda::set_kernel_choice(cuda::KernelChoice::Fast);
    cuda::LaunchWindow w;
    optim::adamw_updates(fast_updates, o);
    EXPECT_EQ(w.count(), 1);
    cuda::reset_kernel_choice();
  }
  for (size_t i = 0; i < kSizes.size(); ++i) {
    EXPECT_EQ(fast_state[i].step.item<int64_t>(), 2);
    EXPECT_EQ(ref_state[i].step.item<int64_t>(), 2);
    expect_close(fast.p[i], ops::to(ref.p[i], kCPU), 0, 0);
  }
}
