// The fast CUDA row kernels' math (tensor/cuda/fast/), run on the CPU in the
// kernels' own order: each of the team's lanes folds its values
// (tensor/kernels/row_lanes.h, online_softmax.h), the lanes meet in the shuffle
// tree's order (team_reduce_model: 32 lanes, then 512 = 16 warps), the
// column sums in their two passes (column_partials.h). Compared with the
// reference ops on the CPU: fp64 to ~1e-13, fp32 to tolerances measured here
// (the kernels sum in another order than the reference's 16 lanes). No GPU
// needed; tests/cuda/test_cuda_rows_fast.cpp runs the kernels themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensor/cuda/kernel_choice.h"
#include "tensor/generator.h"
#include "tensor/kernels/column_partials.h"
#include "tensor/kernels/online_softmax.h"
#include "tensor/kernels/row_lanes.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::kernels;

namespace {

template <class T> DType dtype_of() { return std::is_same_v<T, double> ? kFloat64 : kFloat32; }

template <class T>
std::vector<T> random_values(size_t n, uint64_t seed, double scale = 3.0) {
  Generator gen(seed);
  return ops::mul(randn({int64_t(n)}, gen, dtype_of<T>()), scale).template to_vector<T>();
}

template <class T>
Tensor tensor_of(const std::vector<T>& v, Shape shape) { return from_vector(v, std::move(shape)); }

// Largest |a - b| / (atol * max(1, max |b|) + rtol * |b|) over the elements;
// <= 1 passes. atol scales with the largest value: a sum's rounding grows with
// its terms, not with each output (log_softmax's dx = dy - exp(y) * sum(dy)
// is small where dy is, and off by exp(y) times the sum's rounding).
template <class T>
double worst(const std::vector<T>& a, const std::vector<T>& b, double rtol, double atol) {
  EXPECT_EQ(a.size(), b.size());
  double largest = 1, w = 0;
  for (T v : b) largest = std::max(largest, std::fabs(double(v)));
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    w = std::max(w, std::fabs(double(a[i]) - double(b[i])) / (atol * largest + rtol * std::fabs(double(b[i]))));
  return w;
}

template <class T> MaxSum<T> merge(MaxSum<T> a, MaxSum<T> b) { return max_sum_merge(a, b); }
template <class T> T add(T a, T b) { return a + b; }

// ---- the kernels' per-row steps, lane by lane (softmax_fast.cu and friends) ----

// A team's sum of f(i, x[i]) over x[0..n): each lane in row_lanes' order, then the tree.
template <int Vec, class T, class F>
T team_sum(const T* x, long n, int lanes, F f) {
  std::vector<T> lane(size_t(lanes), T(0));
  for (int l = 0; l < lanes; ++l) for_lane_values<Vec>(x, n, l, lanes, [&](long i, T v) { lane[size_t(l)] += f(i, v); });
  return team_reduce_model(lane.data(), lanes, add<T>, T(0));
}

template <int Vec, class T>
MaxSum<T> team_max_sum(const T* x, long n, int lanes, T scale) {
  std::vector<MaxSum<T>> lane(size_t(lanes), max_sum_empty<T>());
  for (int l = 0; l < lanes; ++l)
    for_lane_values<Vec>(x, n, l, lanes, [&](long, T v) { max_sum_add(lane[size_t(l)], v * scale); });
  return team_reduce_model(lane.data(), lanes, merge<T>, max_sum_empty<T>());
}

// softmax_forward_kernel: visible = n unless causal; log picks log_softmax.
template <int Vec, class T>
void softmax_row_fast(const T* x, T* y, long n, long visible, T scale, bool log, int lanes) {
  const MaxSum<T> ms = team_max_sum<Vec>(x, visible, lanes, scale);
  const T log_s = std::log(ms.s), inv = T(1) / ms.s;
  for (long i = 0; i < n; ++i)
    y[i] = log ? (x[i] - ms.m) - log_s : i < visible ? exp_approx(x[i] * scale - ms.m) * inv : T(0);
}

// softmax_backward_kernel (log = false: softmax, causal when visible < n or scale != 1).
template <int Vec, class T>
void softmax_backward_row_fast(const T* dy, const T* y, T* dx, long n, long visible, T scale, bool log, bool causal,
                               int lanes) {
  const T s = log ? team_sum<Vec>(dy, n, lanes, [](long, T d) { return d; })
                  : team_sum<Vec>(dy, visible, lanes, [&](long i, T d) { return d * y[i]; });
  for (long i = 0; i < n; ++i)
    dx[i] = log ? dy[i] - exp_approx(y[i]) * s
          : !causal ? y[i] * (dy[i] - s)
          : i < visible ? (y[i] * (dy[i] - s)) * scale : T(0);
}

// Every row of [rows, n] through a row function; results as one vector.
template <class T, class Row>
std::vector<T> by_rows(long rows, long n, Row row) {
  std::vector<T> out(static_cast<size_t>(rows * n));
  for (long r = 0; r < rows; ++r) row(r, out.data() + r * n);
  return out;
}

// Row lengths: short, not a multiple of 4 or 32, a warp's limit, past it (a block), a vocabulary.
const long kLengths[] = {1, 7, 37, 64, 1000, 1024, 1027, 50257};

template <class T>
void check_softmax_family(double rtol, double atol) {
  for (long n : kLengths) {
    const long rows = n > 2000 ? 2 : 5;
    const int lanes = n > kWarpRowMax ? kRowBlockThreads : kWarpSize;
    SCOPED_TRACE(::testing::Message() << "n " << n << ", lanes " << lanes);
    const std::vector<T> x = random_values<T>(size_t(rows * n), 1), dy = random_values<T>(size_t(rows * n), 2, 1.0);
    const Tensor xt = tensor_of(x, {rows, n}), dyt = tensor_of(dy, {rows, n});
    auto fwd = [&](auto vec, bool log) {
      return by_rows<T>(rows, n, [&](long r, T* y) {
        softmax_row_fast<decltype(vec)::value>(x.data() + r * n, y, n, n, T(1), log, lanes);
      });
    };
    const std::vector<T> ref_y = ops::softmax(xt).template to_vector<T>(), ref_ly = ops::log_softmax(xt).template to_vector<T>();
    EXPECT_LE(worst(fwd(std::integral_constant<int, 1>{}, false), ref_y, rtol, atol), 1.0);
    EXPECT_LE(worst(fwd(std::integral_constant<int, 4>{}, false), ref_y, rtol, atol), 1.0);
    EXPECT_LE(worst(fwd(std::integral_constant<int, 4>{}, true), ref_ly, rtol, atol), 1.0);
    const std::vector<T> gy = by_rows<T>(rows, n, [&](long r, T* dx) {
      softmax_backward_row_fast<4>(dy.data() + r * n, ref_y.data() + r * n, dx, n, n, T(1), false, false, lanes);
    });
    EXPECT_LE(worst(gy, ops::softmax_backward(dyt, tensor_of(ref_y, {rows, n})).template to_vector<T>(), rtol, atol), 1.0);
    const std::vector<T> gly = by_rows<T>(rows, n, [&](long r, T* dx) {
      softmax_backward_row_fast<4>(dy.data() + r * n, ref_ly.data() + r * n, dx, n, n, T(1), true, false, lanes);
    });
    EXPECT_LE(worst(gly, ops::log_softmax_backward(dyt, tensor_of(ref_ly, {rows, n})).template to_vector<T>(), rtol, atol),
              1.0);
  }
}

TEST(FastRowMath, SoftmaxFamilyInTheKernelsOrderMatchesTheReference) {
  // Measured (2026-11-27): at most 0.42 of these tolerances in fp64, 0.4 in fp32
  // (log_softmax's backward over 50257 values: dx = dy - exp(y) * sum(dy)).
  check_softmax_family<double>(1e-13, 1e-15);
  check_softmax_family<float>(2e-6, 1e-6);
}

// Causal scores [T, T] (one head): row t sees t + 1 keys; T = 21 and 1024.
template <class T>
void check_causal(double rtol, double atol) {
  for (long n : {21L, 1024L}) {
    SCOPED_TRACE(::testing::Message() << "T " << n);
    const T scale = T(0.125);
    const std::vector<T> x = random_values<T>(size_t(n * n), 3), dy = random_values<T>(size_t(n * n), 4, 1.0);
    const Tensor xt = tensor_of(x, {n, n});
    const std::vector<T> ref = ops::causal_softmax(xt, 0.125).template to_vector<T>();
    const std::vector<T> y = by_rows<T>(n, n, [&](long r, T* out) {
      softmax_row_fast<4>(x.data() + r * n, out, n, r + 1, scale, false, kWarpSize);
    });
    EXPECT_LE(worst(y, ref, rtol, atol), 1.0);
    const std::vector<T> dx = by_rows<T>(n, n, [&](long r, T* out) {
      softmax_backward_row_fast<4>(dy.data() + r * n, ref.data() + r * n, out, n, r + 1, scale, false, true, kWarpSize);
    });
    const Tensor ref_dx = ops::causal_softmax_backward(tensor_of(dy, {n, n}), tensor_of(ref, {n, n}), 0.125);
    EXPECT_LE(worst(dx, ref_dx.template to_vector<T>(), rtol, atol), 1.0);
  }
}

TEST(FastRowMath, CausalSoftmaxInTheKernelsOrderMatchesTheReference) {
  check_causal<double>(1e-13, 1e-15);
  check_causal<float>(2e-6, 1e-7);
}

// ---- layer norm (layernorm_fast.cu): rows of C = 768 (a warp) and 1500 (a block) ----

template <int Vec, class T>
void layernorm_row_fast(const T* x, const T* w, const T* b, T* y, long C, T eps, T* mean, T* rstd, int lanes) {
  const T m = team_sum<Vec>(x, C, lanes, [](long, T v) { return v; }) / T(C);
  const T var = team_sum<Vec>(x, C, lanes, [&](long, T v) { return (v - m) * (v - m); }) / T(C);
  const T rs = T(1) / std::sqrt(var + eps);
  for (long i = 0; i < C; ++i) y[i] = ((x[i] - m) * rs) * w[i] + b[i];
  *mean = m;
  *rstd = rs;
}

template <int Vec, class T>
void layernorm_backward_row_fast(const T* dy, const T* x, const T* w, T m, T rs, T* dx, long C, int lanes) {
  auto n = [&](long i) { return (x[i] - m) * rs; };
  const T g_mean = team_sum<Vec>(dy, C, lanes, [&](long i, T d) { return d * w[i]; }) / T(C);
  const T gn_mean = team_sum<Vec>(dy, C, lanes, [&](long i, T d) { return (d * w[i]) * n(i); }) / T(C);
  for (long i = 0; i < C; ++i) dx[i] = rs * (dy[i] * w[i] - g_mean - n(i) * gn_mean);
}

// dw, db of [rows, C] in the two passes (param_grads_partial_kernel, param_grads_sum_kernel).
template <class T>
void layernorm_param_grads_fast(const T* dy, const T* x, const T* mean, const T* rstd, long rows, long C,
                                long rows_per_block, T* dw, T* db) {
  const long blocks = partial_blocks(rows, rows_per_block);
  std::vector<T> pdw(static_cast<size_t>(blocks * C)), pdb(static_cast<size_t>(blocks * C));
  for (long b = 0; b < blocks; ++b)
    for (long c = 0; c < C; ++c) {
      pdw[size_t(b * C + c)] = block_column_sum<T>(b, rows, rows_per_block, [&](long r) {
        return dy[r * C + c] * ((x[r * C + c] - mean[r]) * rstd[r]);
      });
      pdb[size_t(b * C + c)] = block_column_sum<T>(b, rows, rows_per_block, [&](long r) { return dy[r * C + c]; });
    }
  for (long c = 0; c < C; ++c) {
    dw[c] = sum_of_partials(pdw.data(), blocks, C, c);
    db[c] = sum_of_partials(pdb.data(), blocks, C, c);
  }
}

template <class T>
void check_layernorm(double rtol, double atol, double grad_rtol) {
  for (long C : {768L, 1500L, 37L}) {
    const long rows = 200;
    const int lanes = C > kWarpRowMax ? kRowBlockThreads : kWarpSize;
    SCOPED_TRACE(::testing::Message() << "C " << C << ", lanes " << lanes);
    const std::vector<T> x = random_values<T>(size_t(rows * C), 5), dy = random_values<T>(size_t(rows * C), 6, 1.0);
    const std::vector<T> w = random_values<T>(size_t(C), 7, 1.0), b = random_values<T>(size_t(C), 8, 1.0);
    const Tensor xt = tensor_of(x, {rows, C}), wt = tensor_of(w, {C}), bt = tensor_of(b, {C});
    const ops::LayerNormResult ref = ops::layer_norm(xt, wt, bt, 1e-5);
    std::vector<T> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
    const std::vector<T> y = by_rows<T>(rows, C, [&](long r, T* out) {
      layernorm_row_fast<4>(x.data() + r * C, w.data(), b.data(), out, C, T(1e-5), &mean[size_t(r)],
                            &rstd[size_t(r)], lanes);
    });
    EXPECT_LE(worst(y, ref.y.template to_vector<T>(), rtol, atol), 1.0);
    EXPECT_LE(worst(mean, ref.mean.template to_vector<T>(), rtol, atol), 1.0);
    EXPECT_LE(worst(rstd, ref.rstd.template to_vector<T>(), rtol, atol), 1.0);
    const ops::LayerNormGrads rg = ops::layer_norm_backward(tensor_of(dy, {rows, C}), xt, wt, ref.mean, ref.rstd);
    const std::vector<T> rm = ref.mean.template to_vector<T>(), rr = ref.rstd.template to_vector<T>();
    const std::vector<T> dx = by_rows<T>(rows, C, [&](long r, T* out) {
      layernorm_backward_row_fast<1>(dy.data() + r * C, x.data() + r * C, w.data(), rm[size_t(r)], rr[size_t(r)], out,
                                     C, lanes);
    });
    EXPECT_LE(worst(dx, rg.dx.template to_vector<T>(), grad_rtol, atol), 1.0);
    std::vector<T> dw(static_cast<size_t>(C)), db(static_cast<size_t>(C));
    layernorm_param_grads_fast(dy.data(), x.data(), rm.data(), rr.data(), rows, C, kRowsPerPartial, dw.data(),
                               db.data());
    EXPECT_LE(worst(dw, rg.dweight.template to_vector<T>(), grad_rtol, atol), 1.0);
    EXPECT_LE(worst(db, rg.dbias.template to_vector<T>(), grad_rtol, atol), 1.0);
  }
}

TEST(FastRowMath, LayerNormInTheKernelsOrderMatchesTheReference) {
  // Measured: at most 0.14 of these tolerances (fp32 dw over 200 rows in 4 blocks).
  check_layernorm<double>(1e-13, 1e-14, 1e-12);
  check_layernorm<float>(2e-6, 1e-6, 2e-5);
}

// The two passes' order is fixed by (rows, rows per block) alone: the same
// input gives the same bits; one block gives the row-order sum; k blocks give
// the sum of the k blocks' row-order sums. The CPU op sums db in the same two
// passes (tensor/ops_nn.cpp), so its bits are these.
TEST(FastRowMath, TwoPassColumnSumsHaveAFixedDocumentedOrder) {
  const long rows = 1000, C = 48;
  const std::vector<float> x = random_values<float>(size_t(rows * C), 9), dy = random_values<float>(size_t(rows * C), 10);
  const Tensor xt = tensor_of(x, {rows, C}), dyt = tensor_of(dy, {rows, C});
  const ops::LayerNormResult fwd = ops::layer_norm(xt, Tensor(), Tensor(), 1e-5);
  const std::vector<float> mean = fwd.mean.to_vector<float>(), rstd = fwd.rstd.to_vector<float>();
  auto two_pass = [&](long rows_per_block) {
    std::vector<float> dw(static_cast<size_t>(C)), db(static_cast<size_t>(C));
    layernorm_param_grads_fast(dy.data(), x.data(), mean.data(), rstd.data(), rows, C, rows_per_block, dw.data(),
                               db.data());
    return std::make_pair(dw, db);
  };
  const auto first = two_pass(kRowsPerPartial), again = two_pass(kRowsPerPartial);
  EXPECT_EQ(0, std::memcmp(first.first.data(), again.first.data(), sizeof(float) * size_t(C)));
  EXPECT_EQ(0, std::memcmp(first.second.data(), again.second.data(), sizeof(float) * size_t(C)));

  const ops::LayerNormGrads ref = ops::layer_norm_backward(dyt, xt, Tensor(), fwd.mean, fwd.rstd);
  EXPECT_EQ(first.second, ref.dbias.to_vector<float>());  // (dw: the op's row kernel may fuse its multiply-add)
  const auto one_block = two_pass(rows);  // rows in row order

  // 16 blocks of 64 rows (the last one 40): the sum of the blocks' sums, in block order.
  const long blocks = partial_blocks(rows, kRowsPerPartial);
  ASSERT_EQ(blocks, 16);
  int differs = 0;
  for (long c = 0; c < C; ++c) {
    float expected = 0;
    double magnitude = 0;  // sum of |terms|: what the rounding of a sum scales with
    for (long b = 0; b < blocks; ++b) {
      float block = 0;
      for (long r = b * kRowsPerPartial; r < std::min(rows, (b + 1) * kRowsPerPartial); ++r) {
        block += dy[size_t(r * C + c)];
        magnitude += std::fabs(dy[size_t(r * C + c)]);
      }
      expected += block;
    }
    EXPECT_EQ(first.second[size_t(c)], expected) << "column " << c;
    EXPECT_NEAR(first.second[size_t(c)], one_block.second[size_t(c)], 1e-6 * magnitude) << "column " << c;
    differs += first.second[size_t(c)] != one_block.second[size_t(c)];
  }
  EXPECT_GT(differs, 0) << "16 blocks rounded every column as one block did: the partition is not being used";
}

// ---- cross-entropy over a vocabulary (cross_entropy_fast.cu) ----

template <class T>
void check_cross_entropy(double rtol, double atol) {
  for (long V : {37L, 1024L, 50257L}) {
    const long N = 3;
    const int lanes = V > kWarpRowMax ? kRowBlockThreads : kWarpSize;
    SCOPED_TRACE(::testing::Message() << "V " << V << ", lanes " << lanes);
    const std::vector<T> x = random_values<T>(size_t(N * V), 11);
    const std::vector<int64_t> target = {0, V - 1, V / 3};
    const Tensor xt = tensor_of(x, {N, V}), tt = from_vector(target, {N});
    const ops::CrossEntropyResult ref = ops::cross_entropy(xt, tt);
    const std::vector<T> ref_lse = ref.lse.template to_vector<T>();
    double loss = 0;
    std::vector<T> lse(static_cast<size_t>(N)), dx(static_cast<size_t>(N * V));
    const T scale = T(1.0 / double(N));
    for (long r = 0; r < N; ++r) {
      const T* xr = x.data() + r * V;
      const MaxSum<T> ms = team_max_sum<4>(xr, V, lanes, T(1));
      lse[size_t(r)] = ms.m + std::log(ms.s);
      loss += double((ms.m - xr[target[size_t(r)]]) + std::log(ms.s));
      for (long i = 0; i < V; ++i)  // the backward kernel, from the reference's lse
        dx[size_t(r * V + i)] = (exp_approx(xr[i] - ref_lse[size_t(r)]) - (i == target[size_t(r)] ? T(1) : T(0))) * scale;
    }
    EXPECT_LE(worst(lse, ref_lse, rtol, atol), 1.0);
    EXPECT_NEAR(loss / double(N), ref.loss.item<double>(), rtol * 20);
    const Tensor ref_dx = ops::cross_entropy_backward(full({}, 1.0, dtype_of<T>()), xt, tt, ref.lse, ref.count);
    // Elementwise, the same expression: the same value to a few units in the last place. (Not always the
    // same bits: GCC contracts a * b + c into one FMA inside exp_approx at -O2 and up, where the library
    // is compiled, and not at this file's -O0, tests/CMakeLists.txt.)
    EXPECT_LE(worst(dx, ref_dx.template to_vector<T>(), 8 * std::numeric_limits<T>::epsilon(), 1e-300), 1.0);
  }
}

TEST(FastRowMath, CrossEntropyInTheKernelsOrderMatchesTheReference) {
  check_cross_entropy<double>(1e-13, 1e-14);
  check_cross_entropy<float>(2e-6, 1e-6);
}

// ---- embedding backward (embedding_backward_fast.cu): slices keep token order ----

TEST(FastRowMath, EmbeddingBackwardBySlicesIsTheReferenceBitForBit) {
  const long N = 300, V = 97, C = 40, slices = 64, slice = (V + slices - 1) / slices;
  const std::vector<float> g = random_values<float>(size_t(N * C), 12);
  std::vector<int64_t> idx(static_cast<size_t>(N));
  for (long i = 0; i < N; ++i) idx[size_t(i)] = (i * 7919 + i / 3) % 13 * 7 % V;  // few ids, many repeats
  std::vector<float> dw(size_t(V * C), 0.0f);
  for (long s = 0; s < slices; ++s)  // blockIdx.y
    for (long c = 0; c < C; ++c)     // a thread
      for (long i = 0; i < N; ++i)
        if (idx[size_t(i)] >= s * slice && idx[size_t(i)] < (s + 1) * slice)
          dw[size_t(idx[size_t(i)] * C + c)] += g[size_t(i * C + c)];
  EXPECT_EQ(dw, ops::embedding_backward(tensor_of(g, {N, C}), from_vector(idx, {N}), V).to_vector<float>());
}

// ---- the tree itself ----

// After the butterfly every lane holds the same bits (the merge and the sum are
// commutative), and lane 0's result is the tree (((v0 + v16) + (v8 + v24)) + ...).
TEST(FastRowMath, TheShuffleTreeLeavesEveryLaneTheSameBits) {
  std::vector<float> v = random_values<float>(kWarpSize, 13, 1e3);
  float expect[kWarpSize];
  for (int l = 0; l < kWarpSize; ++l) expect[l] = v[size_t(l)];
  for (int width = kWarpSize / 2; width > 0; width /= 2)  // lane l adds lane l + width: the same pairs, for lane 0
    for (int l = 0; l < width; ++l) expect[l] = expect[l] + expect[l + width];
  butterfly_all_lanes(v.data(), add<float>);
  for (int l = 0; l < kWarpSize; ++l) EXPECT_EQ(v[size_t(l)], expect[0]) << "lane " << l;

  std::vector<MaxSum<float>> ms(kWarpSize);
  const std::vector<float> x = random_values<float>(kWarpSize * 3, 14, 10.0);
  for (int l = 0; l < kWarpSize; ++l) {
    ms[size_t(l)] = max_sum_empty<float>();
    for (int k = 0; k < 3; ++k) max_sum_add(ms[size_t(l)], x[size_t(l * 3 + k)]);
  }
  ms[5] = max_sum_empty<float>();  // a lane that saw nothing (a row shorter than the team)
  butterfly_all_lanes(ms.data(), merge<float>);
  for (int l = 1; l < kWarpSize; ++l) {
    EXPECT_EQ(ms[size_t(l)].m, ms[0].m) << "lane " << l;
    EXPECT_EQ(ms[size_t(l)].s, ms[0].s) << "lane " << l;
  }
}

// The online max/sum gives the two-pass reference's max exactly and its sum
// to rounding, including -inf (masked) values and a row of only -inf.
TEST(FastRowMath, OnlineMaxSumEqualsTheTwoPassMaxAndSum) {
  std::vector<double> x = random_values<double>(1000, 15, 20.0);
  x[3] = x[500] = -INFINITY;
  MaxSum<double> ms = max_sum_empty<double>();
  for (double v : x) max_sum_add(ms, v);
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  EXPECT_EQ(ms.m, m);
  EXPECT_NEAR(ms.s, s, 1e-13 * s);
  MaxSum<double> none = max_sum_empty<double>();
  max_sum_add(none, -double(INFINITY));
  const MaxSum<double> both = max_sum_merge(none, max_sum_empty<double>());
  EXPECT_EQ(both.m, -double(INFINITY));
  EXPECT_EQ(both.s, 0.0);  // not NaN
}

// ---- the switch (tensor/cuda/kernel_choice.h) ----

// The environment is read on every call; set_kernel_choice overrides it until reset.
TEST(FastRowMath, KernelChoiceFollowsTheEnvironmentUnlessSet) {
  const char* before = std::getenv("LOOM_CUDA_KERNELS");
  const std::string saved = before ? before : "";
  unsetenv("LOOM_CUDA_KERNELS");
  EXPECT_EQ(cuda::kernel_choice(), cuda::KernelChoice::Reference);
  setenv("LOOM_CUDA_KERNELS", "fast", 1);
  EXPECT_TRUE(cuda::fast_kernels());
  cuda::set_kernel_choice(cuda::KernelChoice::Reference);
  EXPECT_FALSE(cuda::fast_kernels());
  cuda::reset_kernel_choice();
  EXPECT_TRUE(cuda::fast_kernels());
  setenv("LOOM_CUDA_KERNELS", "reference", 1);
  EXPECT_FALSE(cuda::fast_kernels());
  setenv("LOOM_CUDA_KERNELS", "quick", 1);
  try {
    cuda::kernel_choice();
    ADD_FAILURE() << "LOOM_CUDA_KERNELS=quick was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_CUDA_KERNELS=quick: expected fast or reference"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cuda::parse_kernel_choice("fast", "--cuda-kernels"), cuda::KernelChoice::Fast);
  if (before) setenv("LOOM_CUDA_KERNELS", saved.c_str(), 1);
  else unsetenv("LOOM_CUDA_KERNELS");
}

}  // namespace
