// Elementwise ops and reductions: the GPU against the CPU on the same inputs,
// in every floating dtype, with broadcasting and non-contiguous operands.
#include <functional>

#include "cuda_test.h"

using namespace loom;
using cuda_test::expect_close;
using cuda_test::random;
using cuda_test::rtol_for;

using CudaOps = cuda_test::CudaTest;

const DType kFloats[] = {kFloat32, kFloat64, kBFloat16, kFloat16};

TEST_F(CudaOps, UnaryOpsMatchTheCpu) {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> unary = {
      {"neg", [](const Tensor& x) { return ops::neg(x); }},
      {"exp", [](const Tensor& x) { return ops::exp(x); }},
      {"log", [](const Tensor& x) { return ops::log(ops::add(ops::mul(x, x), 0.5)); }},
      {"tanh", [](const Tensor& x) { return ops::tanh(x); }},
      {"sqrt", [](const Tensor& x) { return ops::sqrt(ops::add(ops::mul(x, x), 0.1)); }},
      {"pow2", [](const Tensor& x) { return ops::pow(x, 2.0); }},
      {"pow3", [](const Tensor& x) { return ops::pow(x, 3.0); }},
      {"relu", [](const Tensor& x) { return ops::relu(x); }},
      {"gelu", [](const Tensor& x) { return ops::gelu(x); }},
      {"gt", [](const Tensor& x) { return ops::gt_scalar(x, 0.25); }},
      {"add_s", [](const Tensor& x) { return ops::add(x, 1.5); }},
      {"mul_s", [](const Tensor& x) { return ops::mul(x, -0.75); }},
      {"rsub", [](const Tensor& x) { return ops::rsub(2.0, x); }},
      {"rdiv", [](const Tensor& x) { return ops::rdiv(1.0, ops::add(ops::mul(x, x), 1.0)); }},
  };
  for (DType dt : kFloats)
    for (const auto& [name, f] : unary) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(dt));
      Tensor x = random({7, 33}, 5, dt);
      expect_close(f(ops::to(x, gpu)), f(x), rtol_for(dt), 1e-6);
      Tensor xt = ops::transpose(x, 0, 1);  // non-contiguous input
      expect_close(f(ops::transpose(ops::to(x, gpu), 0, 1)), f(xt), rtol_for(dt), 1e-6);
    }
}

TEST_F(CudaOps, BinaryOpsBroadcastAndStride) {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> binary = {
      {"add", [](const Tensor& a, const Tensor& b) { return ops::add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return ops::sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return ops::mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return ops::div(a, ops::add(ops::mul(b, b), 0.5)); }},
      {"gelu_backward", [](const Tensor& a, const Tensor& b) { return ops::gelu_backward(a, b); }},
  };
  for (DType dt : kFloats)
    for (const auto& [name, f] : binary) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(dt));
      Tensor a = random({4, 6, 5}, 1, dt), b = random({6, 1}, 2, dt), c = random({5, 6, 4}, 3, dt);
      Tensor ga = ops::to(a, gpu), gb = ops::to(b, gpu), gc = ops::to(c, gpu);
      expect_close(f(ga, gb), f(a, b), rtol_for(dt), 1e-6);    // [4,6,5] with [6,1]
      expect_close(f(gb, ga), f(b, a), rtol_for(dt), 1e-6);    // broadcast on the left
      Tensor ct = ops::permute(c, {2, 1, 0}), gct = ops::permute(gc, {2, 1, 0});  // [4,6,5], strided
      expect_close(f(ga, gct), f(a, ct), rtol_for(dt), 1e-6);
      expect_close(f(ops::narrow(ga, 2, 1, 3), ops::narrow(gct, 2, 0, 3)),
                   f(ops::narrow(a, 2, 1, 3), ops::narrow(ct, 2, 0, 3)), rtol_for(dt), 1e-6);
      Tensor s = random({}, 4, dt);  // 0-d
      expect_close(f(ga, ops::to(s, gpu)), f(a, s), rtol_for(dt), 1e-6);
    }
}

TEST_F(CudaOps, InPlaceAddAndMul) {
  for (DType dt : kFloats) {
    Tensor d = random({8, 9}, 1, dt), s = random({9}, 2, dt);
    Tensor gd = ops::to(d, gpu);
    ops::add_(gd, ops::to(s, gpu), -0.5);
    ops::add_(d, s, -0.5);
    expect_close(gd, d, rtol_for(dt), 1e-6);
    ops::mul_(ops::transpose(gd, 0, 1), 3.0);
    ops::mul_(ops::transpose(d, 0, 1), 3.0);
    expect_close(gd, d, rtol_for(dt), 1e-6);
  }
}

TEST_F(CudaOps, WhereMaskedFillAndCausalMask) {
  Tensor a = random({3, 4, 4}, 1), b = random({4, 4}, 2);
  Tensor cond = ops::gt_scalar(random({4, 1}, 3), 0.0);
  expect_close(ops::where(ops::to(cond, gpu), ops::to(a, gpu), ops::to(b, gpu)), ops::where(cond, a, b), 0, 0);
  Tensor mask = ops::to(ops::gt_scalar(random({3, 1, 4}, 4), 0.0), kInt64);
  expect_close(ops::masked_fill(ops::to(a, gpu), ops::to(mask, gpu), -7.0), ops::masked_fill(a, mask, -7.0), 0, 0);
  expect_close(ops::causal_mask_fill(ops::to(a, gpu), -1e9), ops::causal_mask_fill(a, -1e9), 0, 0);
}

TEST_F(CudaOps, SumAndMeanOverDims) {
  for (DType dt : kFloats) {
    Tensor x = random({5, 7, 6}, 9, dt);
    Tensor g = ops::to(x, gpu);
    SCOPED_TRACE(dtype_name(dt));
    expect_close(ops::sum(g), ops::sum(x), rtol_for(dt), 1e-6);
    expect_close(ops::mean(g), ops::mean(x), rtol_for(dt), 1e-6);
    for (std::vector<int64_t> dims : {std::vector<int64_t>{0}, {1}, {2}, {0, 2}, {-1, 0}, {0, 1, 2}})
      for (bool keep : {false, true}) {
        expect_close(ops::sum(g, dims, keep), ops::sum(x, dims, keep), rtol_for(dt), 1e-6);
        expect_close(ops::mean(g, dims, keep), ops::mean(x, dims, keep), rtol_for(dt), 1e-6);
      }
    Tensor xt = ops::permute(x, {2, 0, 1}), gt = ops::permute(g, {2, 0, 1});  // strided input
    expect_close(ops::sum(gt, {1}, false), ops::sum(xt, {1}, false), rtol_for(dt), 1e-6);
    expect_close(ops::sum_to(ops::expand(g, {3, 5, 7, 6}), {7, 1}), ops::sum_to(ops::expand(x, {3, 5, 7, 6}), {7, 1}),
                 rtol_for(dt), 1e-6);
  }
  // A long sum (one block per output, a fixed-order tree): the same bits twice.
  Tensor big = ops::to(random({1 << 18}, 10), gpu);
  EXPECT_EQ(ops::sum(big).item<double>(), ops::sum(big).item<double>());
  expect_close(ops::sum(big), ops::sum(ops::to(big, kCPU)), 1e-5, 1e-4);
}

TEST_F(CudaOps, IndexOpsMatchTheCpu) {
  Tensor x = random({3, 5, 4}, 1);
  Tensor idx = from_vector(std::vector<int64_t>{4, 0, 4, 2});  // a repeated index: index_add sums it
  Tensor gx = ops::to(x, gpu), gidx = ops::to(idx, gpu);
  expect_close(ops::index_select(gx, 1, gidx), ops::index_select(x, 1, idx), 0, 0);
  expect_close(ops::index_select(gx, -1, ops::to(ops::to(idx, kInt32), gpu)), ops::index_select(x, -1, ops::to(idx, kInt32)),
               0, 0);
  Tensor src = random({3, 4, 4}, 2);
  expect_close(ops::index_add(gx, 1, gidx, ops::to(src, gpu)), ops::index_add(x, 1, idx, src), 0, 0);
  Tensor gather_idx = from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 4, 3, 2, 1, 0, 0, 0}, {3, 1, 4});
  expect_close(ops::gather(gx, 1, ops::to(gather_idx, gpu)), ops::gather(x, 1, gather_idx), 0, 0);
  Tensor gsrc = random({3, 1, 4}, 3);
  expect_close(ops::scatter_add({3, 5, 4}, 1, ops::to(gather_idx, gpu), ops::to(gsrc, gpu)),
               ops::scatter_add({3, 5, 4}, 1, gather_idx, gsrc), 0, 0);
}

TEST_F(CudaOps, MaxOverADim) {
  Tensor x = random({6, 9, 4}, 3);
  Tensor g = ops::to(x, gpu);
  for (int64_t d : {0, 1, 2, -1})
    for (bool keep : {false, true}) {
      auto [gv, gi] = ops::max(g, d, keep);
      auto [cv, ci] = ops::max(x, d, keep);
      expect_close(gv, cv, 0, 0);
      expect_close(gi, ci, 0, 0);
    }
  expect_close(ops::max(g), ops::max(x), 0, 0);
}
