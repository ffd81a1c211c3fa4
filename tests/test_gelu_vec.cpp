// GELU's fast runs (tensor/cpu/gelu_vec.*: 4 vectors in flight at AVX2)
// against kernels::gelu and kernels::gelu_backward, the reference, as the
// library compiles it (the strided loop ops::gelu runs on a view that is not
// contiguous): the same bits on values across the whole float range and its
// edges (±0, subnormals, exp_approx's cut-offs, ±inf, NaN), on every length
// from 0 to past two steps of 32 (odd ones, runs shorter than a vector,
// unaligned starts), in place, and through the ops on contiguous tensors
// (split over the math threads). tests/avx2.sh runs it at x86-64-v3, where
// the fast runs are on; elsewhere it checks the reference against itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/cpu/gelu_vec.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

// As tests/test_causal_softmax_rows.cpp: the reference's a * b + c are FMAs where the compiler contracts them
// (GCC from -O2 on, clang at every level); in GCC's -O0/-O1 library builds (LOOM_REFERENCE_UNCONTRACTED) they
// are rounded apart, and values are compared within a tolerance instead of bit for bit.
#ifdef LOOM_REFERENCE_UNCONTRACTED
constexpr bool kExact = false;
#else
constexpr bool kExact = true;
#endif

// Equal bits, or NaN against NaN, or (uncontracted reference) within 1e-6 of `scale`.
bool agree(float got, float ref, float scale) {
  if (std::memcmp(&got, &ref, 4) == 0 || (std::isnan(got) && std::isnan(ref))) return true;
  return !kExact && std::fabs(got - ref) <= 1e-6f * scale;
}

// The values as a non-contiguous [n, 1] view (column 0 of [n, 2]): the ops run the strided loop on it.
Tensor strided(const std::vector<float>& v) {
  std::vector<float> two(2 * v.size(), 0.0f);
  for (size_t i = 0; i < v.size(); ++i) two[2 * i] = v[i];
  Tensor t = ops::narrow(from_vector(two, {int64_t(v.size()), 2}), 1, 0, 1);
  EXPECT_FALSE(t.is_contiguous());
  return t;
}
std::vector<float> reference_gelu(const std::vector<float>& x) { return ops::gelu(strided(x)).to_vector<float>(); }
std::vector<float> reference_backward(const std::vector<float>& g, const std::vector<float>& x) {
  return ops::gelu_backward(strided(g), strided(x)).to_vector<float>();
}

// Values across the float range: every 4093rd bit pattern, the edges, a fine grid, normal draws.
std::vector<float> test_values() {
  std::vector<float> v;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) {
    const uint32_t b = uint32_t(u);
    float x;
    std::memcpy(&x, &b, 4);
    v.push_back(x);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, -1e-38f, inf, -inf, std::nanf(""), 1.0f, -1.0f, 3.4e38f,
                  -3.4e38f, 5.0f, -5.0f, 10.0f, -10.0f, 30.0f, -30.0f})
    v.push_back(x);
  // -2u crosses exp_approx's cut-offs (-103.97, 88.75) near x = 8.3 and x = -7.7: a fine grid there.
  for (float x = -9.0f; x < 10.0f; x += 0.001953125f) v.push_back(x);
  Generator g(7);
  for (double spread : {0.1, 1.0, 4.0})
    for (float x : ops::mul(randn({4096}, g), spread).to_vector<float>()) v.push_back(x);
  return v;
}

TEST(GeluVec, ForwardHasTheReferenceBitsOnEveryValue) {
  const std::vector<float> x = test_values(), ref = reference_gelu(x);
  std::vector<float> y(x.size(), 12345.0f);
  cpu::gelu_run(x.data(), y.data(), int64_t(x.size()));
  int64_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += !agree(y[i], ref[i], 1.0f + std::fabs(x[i]));
  EXPECT_EQ(differ, 0) << "of " << x.size() << " values";
}

TEST(GeluVec, BackwardHasTheReferenceBitsOnEveryValue) {
  const std::vector<float> x = test_values();
  Generator gen(8);
  const std::vector<float> g = randn({int64_t(x.size())}, gen).to_vector<float>(), ref = reference_backward(g, x);
  std::vector<float> out(x.size(), 12345.0f);
  cpu::gelu_backward_run(g.data(), x.data(), out.data(), int64_t(x.size()));
  int64_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += !agree(out[i], ref[i], 2.0f * std::fabs(g[i]));
  EXPECT_EQ(differ, 0) << "of " << x.size() << " values";
}

// Every length 0..80 at starts 0..3 floats past the vector's, out of place and in place; nothing past the run
// written.
TEST(GeluVec, EveryLengthAndStartInAndOutOfPlace) {
  Generator gen(9);
  const std::vector<float> x0 = ops::mul(randn({100}, gen), 2.0).to_vector<float>();
  const std::vector<float> g0 = randn({100}, gen).to_vector<float>();
  const std::vector<float> ref_y = reference_gelu(x0), ref_dx = reference_backward(g0, x0);
  int64_t differ = 0, written_past = 0, compared = 0;
  for (int64_t start = 0; start < 4; ++start)
    for (int64_t n = 0; n <= 80; ++n)
      for (bool in_place : {false, true}) {
        std::vector<float> x = x0, g = g0, out(100, 12345.0f);
        std::vector<float>& y = in_place ? x : out;
        cpu::gelu_run(x.data() + start, y.data() + start, n);
        for (int64_t j = start; j < start + n; ++j, ++compared) differ += !agree(y[j], ref_y[j], 1.0f + std::fabs(x0[j]));
        for (int64_t j = start + n; j < 100; ++j) written_past += y[j] != (in_place ? x0[j] : 12345.0f);
        std::fill(out.begin(), out.end(), 12345.0f);
        std::vector<float>& dx = in_place ? g : out;
        cpu::gelu_backward_run(g.data() + start, x0.data() + start, dx.data() + start, n);
        for (int64_t j = start; j < start + n; ++j) differ += !agree(dx[j], ref_dx[j], 2.0f * std::fabs(g0[j]));
        for (int64_t j = start + n; j < 100; ++j) written_past += dx[j] != (in_place ? g0[j] : 12345.0f);
      }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(written_past, 0);
}

// The ops on contiguous tensors (the fast runs, split over the math threads) against the same values strided
// (the reference loop), fp32 and fp64 (which runs the reference in both); odd sizes.
template <class T>
int64_t elements_apart(const Tensor& a, const Tensor& b) {
  const std::vector<T> va = a.to_vector<T>(), vb = b.to_vector<T>();
  int64_t n = 0;
  for (size_t i = 0; i < va.size(); ++i)
    n += kExact ? std::memcmp(&va[i], &vb[i], sizeof(T)) != 0 : std::fabs(double(va[i]) - double(vb[i])) > 1e-5;
  return n;
}

TEST(GeluVec, OpsOnContiguousTensorsMatchTheStridedLoop) {
  for (DType dt : {kFloat32, kFloat64}) {
    Generator gen(10);
    const Tensor x = ops::mul(randn({37, 301}, gen, dt), 3.0), g = randn({37, 301}, gen, dt);
    const Tensor xs = ops::transpose(ops::contiguous(ops::transpose(x, 0, 1)), 0, 1);  // x's values, strided
    const Tensor gs = ops::transpose(ops::contiguous(ops::transpose(g, 0, 1)), 0, 1);
    ASSERT_FALSE(xs.is_contiguous());
    const Tensor pairs[][2] = {{ops::gelu(x), ops::gelu(xs)}, {ops::gelu_backward(g, x), ops::gelu_backward(gs, xs)}};
    for (const auto& p : pairs)
      EXPECT_EQ(dt == kFloat32 ? elements_apart<float>(p[0], p[1]) : elements_apart<double>(p[0], p[1]), 0)
          << dtype_name(dt) << ", of " << p[0].numel();
  }
}

// The ops split their runs at multiples of cpu::kGeluRunStep: the same bits at 1 and 2 threads (in every build,
// GCC's -O1 included, where the two paths round apart). 65573 values: split at multiples of 16 (parallel_for's
// edges), the second thread would start at 32784, inside a step of 32; and the last 5 values are a tail.
TEST(GeluVec, OpsGiveTheSameBitsAtOneAndTwoThreads) {
  const int before = ops::get_num_threads();
  Generator gen(11);
  const Tensor x = ops::mul(randn({65573}, gen), 3.0), g = randn({65573}, gen);
  auto once = [&](int threads) {
    ops::set_num_threads(threads);
    return std::vector<std::vector<float>>{ops::gelu(x).to_vector<float>(), ops::gelu_backward(g, x).to_vector<float>()};
  };
  const auto one = once(1), two = once(2);
  ops::set_num_threads(before);
  EXPECT_EQ(one[0], two[0]) << "gelu";
  EXPECT_EQ(one[1], two[1]) << "gelu_backward";
}

}  // namespace
