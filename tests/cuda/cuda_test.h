// Shared by the tests in tests/cuda: the fixture that skips without a GPU, the
// CPU-vs-GPU comparison every op test makes, and fast-vs-reference kernel runs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tensor/cuda/cuda.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

namespace loom::cuda_test {

// Why no CUDA tensor can be made here ("" when one can): loom's own message.
inline const std::string& gpu_missing_reason() {
  static const std::string reason = [] {
    try {
      empty({1}, kFloat32, Device("cuda:0"));
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
  }();
  return reason;
}

// Every test of a fixture derived from this one skips, with the reason, on a
// machine without a GPU (CI, the development machines).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_missing_reason().empty()) GTEST_SKIP() << "no CUDA device: " << gpu_missing_reason();
  }
  const Device gpu{"cuda:0"};
};

// gpu (copied down) and cpu have the same shape and dtype, and every element
// agrees within atol + rtol * |cpu| (NaN only where the other is NaN).
inline void expect_close(const Tensor& gpu, const Tensor& cpu, double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_TRUE(gpu.device().is_cuda()) << "expected a CUDA result, got one on " << gpu.device().str();
  ASSERT_EQ(gpu.shape(), cpu.shape());
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  std::vector<double> g = gpu.to_vector<double>(), c = cpu.to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < c.size() && bad < 5; ++i) {
    const bool both_nan = std::isnan(g[i]) && std::isnan(c[i]);
    if (both_nan || std::fabs(g[i] - c[i]) <= atol + rtol * std::fabs(c[i])) continue;
    ADD_FAILURE() << "element " << i << ": gpu " << g[i] << " vs cpu " << c[i];
    ++bad;
  }
}

// Tolerance for a dtype: fp32/fp64 to rounding, bf16/fp16 to one unit of their rounding.
inline double rtol_for(DType t) {
  switch (t) {
    case DType::BFloat16: return 1e-2;
    case DType::Float16: return 2e-3;
    case DType::Float64: return 1e-12;
    default: return 1e-5;
  }
}

inline Tensor random(const Shape& shape, uint64_t seed, DType dtype = kFloat32) {
  Generator gen(seed);
  return randn(shape, gen, dtype);
}

// f() with the CUDA kernels set to k (LOOM_CUDA_KERNELS's choice); then the
// environment decides again: the fast path and the reference on the same inputs.
template <class F>
auto with_kernels(cuda::KernelChoice k, F f) {
  struct Restore {
    ~Restore() { cuda::reset_kernel_choice(); }
  } restore;
  cuda::set_kernel_choice(k);
  return f();
}
template <class F> auto fast(F f) { return with_kernels(cuda::KernelChoice::Fast, f); }
template <class F> auto reference(F f) { return with_kernels(cuda::KernelChoice::Reference, f); }

}  // namespace loom::cuda_test
