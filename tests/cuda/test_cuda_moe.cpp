// The mixture of experts on the GPU against the CPU on the same inputs:
// index_add (permute's and unpermute's backward: index_select's), now a stable
// sort of the indices and one segment sum per output (tensor/cuda/index_add.cu, through
// tensor/kernels/segment_sum.h, which the CPU loop calls too), so the CPU's
// bits; then a whole MoE layer's forward and backward (router on the host,
// experts, aux losses) with the CPU layer's weights. tests/test_index_add.cpp
// and tests/test_moe.cpp check the same math on the CPU. Skipped without a GPU.
#include <gmock/gmock.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "cuda_test.h"
#include "nn/moe.h"
#include "tensor/cuda/cuda.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;

using CudaMoE = cuda_test::CudaTest;

// 3000 indices into 37 targets (target 5 never hit, 0 often): along dim 0 and 1,
// int64 and int32 indices, every floating dtype: the CPU's bits.
TEST_F(CudaMoE, IndexAddGivesTheCpusBits) {
  std::vector<int64_t> v;
  for (int64_t j = 0; j < 3000; ++j) v.push_back(j % 3 == 0 ? 0 : (j * 7 + j / 11) % 36 + ((j * 7 + j / 11) % 36 >= 5));
  const Tensor idx = from_vector(v, {3000});
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16})
    for (DType it : {kInt64, kInt32})
      for (int64_t dim : {0, 1}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + dtype_name(it) + " dim " + std::to_string(dim));
        const Shape like = dim == 0 ? Shape{37, 6} : Shape{2, 37, 3};
        const Tensor src = random(dim == 0 ? Shape{3000, 6} : Shape{2, 3000, 3}, 1, dt), i = ops::to(idx, it);
        expect_close(ops::index_add(ops::to(zeros(like, dt), gpu), dim, ops::to(i, gpu), ops::to(src, gpu)),
                     ops::index_add(zeros(like, dt), dim, i, src), 0, 0);
      }
  const Tensor bad = ops::to(from_vector(std::vector<int64_t>{1, 37, 2}), gpu);
  const Tensor out = ops::index_add(ops::to(zeros({37, 6}), gpu), 0, bad, ops::to(random({3, 6}, 2), gpu));
  EXPECT_THAT([&] { cuda::synchronize(gpu); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("index_add: index 37 out of range for size 37")));
}

// E 4, k 2, shared expert, a capacity that drops, both aux losses: output,
// input gradient and every parameter's gradient within fp32 rounding.
TEST_F(CudaMoE, ALayersForwardAndBackwardMatchTheCpu) {
  nn::MoEOptions o;
  o.experts = 4, o.experts_per_token = 2, o.shared_experts = 1, o.capacity_factor = 1.0;
  o.aux_loss_coef = 0.05, o.z_loss_coef = 1e-3;
  auto layer = [&] {
    Generator gen(3);
    return std::make_shared<nn::MoE>(16, 24, o, gen, 0.2);
  };
  auto cpu_layer = layer(), gpu_layer = layer();
  gpu_layer->to(gpu);
  const Tensor x = random({2, 12, 16}, 4), dy = random({2, 12, 16}, 5);
  const Tensor xc = autograd::set_requires_grad(ops::clone(x)), xg = autograd::set_requires_grad(ops::to(x, gpu));
  const Tensor yc = cpu_layer->forward(xc), yg = gpu_layer->forward(xg);
  expect_close(yg, yc);
  autograd::backward(autograd::sum(autograd::mul(yc, dy)));
  autograd::backward(autograd::sum(autograd::mul(yg, ops::to(dy, gpu))));
  expect_close(autograd::grad(xg), autograd::grad(xc), 1e-5, 1e-6);
  const auto cp = cpu_layer->named_parameters(), gp = gpu_layer->named_parameters();
  ASSERT_EQ(cp.size(), gp.size());
  for (size_t i = 0; i < cp.size(); ++i) {
    SCOPED_TRACE(cp[i].first);
    expect_close(autograd::grad(gp[i].second), autograd::grad(cp[i].second), 1e-5, 1e-6);
  }
}
