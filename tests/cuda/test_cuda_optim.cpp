// The optimizer math on the GPU against the CPU: AdamW steps on fp32, bf16 and
// float64 params, the loss-scaling unscale + found_inf, and the grad norm.
#include "autograd/variable.h"
#include "cuda_test.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;
using cuda_test::rtol_for;

using CudaOptim = cuda_test::CudaTest;

TEST_F(CudaOptim, AdamWStepsMatchTheCpu) {
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor p_cpu = random({5, 7}, 1, dt), p_gpu = ops::to(p_cpu, gpu);
    autograd::set_requires_grad(p_cpu);
    autograd::set_requires_grad(p_gpu);
    optim::AdamW on_cpu({{.params = {p_cpu}, .lr = 1e-2, .weight_decay = 0.1}});
    optim::AdamW on_gpu({{.params = {p_gpu}, .lr = 1e-2, .weight_decay = 0.1}});
    for (int step = 0; step < 3; ++step) {
      Tensor g = random({5, 7}, 10 + uint64_t(step), dt);
      autograd::set_grad(p_cpu, g);
      autograd::set_grad(p_gpu, ops::to(g, gpu));
      on_cpu.step();
      on_gpu.step();
    }
    expect_close(p_gpu, p_cpu, rtol_for(dt), 1e-6);
    expect_close(on_gpu.state(0, 0).exp_avg_sq, on_cpu.state(0, 0).exp_avg_sq, rtol_for(dt), 1e-9);
  }
}

TEST_F(CudaOptim, UnscaleMultipliesBackAndFindsInf) {
  Tensor a = random({100}, 1), b = random({3, 4}, 2);
  std::vector<Tensor> gpu_grads = {ops::to(a, gpu), ops::to(b, gpu)};
  EXPECT_FALSE(optim::unscale_(gpu_grads, 0.25));
  std::vector<Tensor> cpu_grads = {ops::clone(a), ops::clone(b)};
  EXPECT_FALSE(optim::unscale_(cpu_grads, 0.25));
  expect_close(gpu_grads[0], cpu_grads[0], 0, 0);
  expect_close(gpu_grads[1], cpu_grads[1], 0, 0);
  ops::fill_(ops::narrow(gpu_grads[1], 0, 2, 1), INFINITY);
  EXPECT_TRUE(optim::unscale_(gpu_grads, 0.5));
}

TEST_F(CudaOptim, GradNormMatchesTheCpu) {
  std::vector<Tensor> cpu = {random({40, 3}, 1), random({7}, 2, kFloat64), random({9}, 3, kBFloat16)};
  std::vector<Tensor> on_gpu;
  for (const Tensor& t : cpu) on_gpu.push_back(ops::to(t, gpu));
  const double want = optim::global_grad_norm(cpu, nullptr);
  EXPECT_NEAR(optim::global_grad_norm(on_gpu, nullptr), want, 1e-12 * want);
}
