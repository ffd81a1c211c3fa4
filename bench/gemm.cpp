// bench_gemm: GEMM throughput of loom::ops::matmul, fp32 on oneDNN and on
// OpenBLAS and bf16 on both of loom's bf16 paths, beside this machine's FMA
// ceiling, measured by the same program.
//
// The ceiling is a hand-written loop of independent FMA chains (AVX-512 when
// the build targets it, else AVX2): enough accumulators to cover the FMA
// latency on every FMA port, so it runs at the core's peak FMA rate and clock
// for that vector width. GEMM can approach it but not pass it; the ratio says
// how much of the hardware the matmul path uses: loom::ops::matmul -> oneDNN
// dnnl_sgemm or OpenBLAS cblas_sgemm (ops::set_gemm_library; tensor/cpu/gemm.h),
// each single-threaded per call with C split over loom's threads. Operands
// are NN, NT, TN, TT: a T operand is a transposed view, passed to the library
// as a transpose, not copied. GEMM timings include allocating the output, as
// every call of matmul does.
//
// bf16 (tensor/cpu/gemm_bf16.h): "bf16" is the native path, oneDNN's bf16
// matmul with fp32 accumulation (where the CPU has AVX512_BF16 or AMX), set
// beside the bf16 ceiling: a like loop of vdpbf16ps, which does two
// multiply-adds per fp32 lane (2x the FMA ceiling where it is native). "bf16
// via fp32" is the reference path (ops::set_bf16_gemm("fp32")): operands
// widened to fp32, sgemm, the result rounded back; set beside the FMA ceiling.
// Two small shapes, 64x32x64 (q kᵀ of the small GPT's attention) and
// 64x64x32 (att @ v), show the fixed cost of one call.
//
// Usage: bench_gemm [--quick]     (--quick: fewer repeats, for a smoke run)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "tensor/generator.h"
#include "tensor/ops.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- FMA ceiling ------------------------------------------------------------------
// kChains independent accumulators: FMA latency is 4 cycles and a core issues
// up to 2 FMAs a cycle, so >= 8 chains keep both ports busy; 12 leaves slack.
constexpr int kChains = 12;
#if defined(__AVX512F__)
constexpr int kLanes = 16;
const char* kIsa = "AVX-512";
using Vec = __m512;
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
#else
constexpr int kLanes = 8;
const char* kIsa = "AVX2";
using Vec = __m256;
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
#endif

// Runs `iters` rounds of kChains FMAs; returns a value so the work is not elided.
float fma_loop(int64_t iters) {
  Vec acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = vset(1.0f + 1e-3f * float(i));
  const Vec m = vset(0.999999f), a = vset(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    // Without -ffast-math the compiler may not fold repeated FMAs, so the
    // accumulators stay in registers and every FMA is executed.
    for (int i = 0; i < kChains; ++i) acc[i] = vfma(acc[i], m, a);
  }
  float s = 0, lanes[kLanes];
  for (int i = 0; i < kChains; ++i) {
    vstore(lanes, acc[i]);
    for (float x : lanes) s += x;
  }
  return s;
}

#if defined(__AVX512BF16__)
// The bf16 ceiling: chains of vdpbf16ps, which multiplies 16 pairs of bf16
// and adds both products of a pair into each fp32 lane (2 x 2 x 16 FLOP per
// instruction, where an FMA does 2 x 16). Its latency is longer than an
// FMA's: on Zen 5, 12 chains reach 390 GF/s and 16 reach 430 (24 spill).
constexpr bool kBf16Ceiling = true;
constexpr int kBf16Chains = 16;
float dpbf16_loop(int64_t iters) {
  __m512 acc[kBf16Chains];
  for (int i = 0; i < kBf16Chains; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-3f * float(i));
  const __m512bh m = (__m512bh)_mm512_set1_epi16(0x3f80), a = (__m512bh)_mm512_set1_epi16(0x3380);  // 1, 6e-8
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kBf16Chains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], m, a);
  float s = 0, lanes[16];
  for (int i = 0; i < kBf16Chains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float x : lanes) s += x;
  }
  return s;
}
#else
constexpr bool kBf16Ceiling = false;  // not built for it: the bf16 ceiling is taken as 2x the FMA one
constexpr int kBf16Chains = kChains;
float dpbf16_loop(int64_t) { return 0; }
#endif

// GFLOP/s of `threads` threads each running `loop` (fma_loop: kChains x 2 x
// kLanes FLOP per iteration; dpbf16_loop: kBf16Chains x 4 x 16), one entry per
// run (~40 ms each, after one warm-up run that brings the core to its AVX-512 clock).
std::vector<double> ceiling_rates(float (*loop)(int64_t), double flops_per_iter, int threads, int runs) {
  const int64_t iters = 15'000'000;
  const double flops_per_thread = double(iters) * flops_per_iter;
  std::vector<double> rates;
  volatile float sink = 0;
  for (int r = 0; r < runs + 1; ++r) {
    std::vector<float> out(static_cast<size_t>(threads), 0.0f);
    auto t0 = Clock::now();
    if (threads == 1) {
      out[0] = loop(iters);
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { out[size_t(t)] = loop(iters); });
      for (auto& th : pool) th.join();
    }
    double s = seconds_since(t0);
    for (float x : out) sink = sink + x;
    if (r > 0) rates.push_back(flops_per_thread * threads / s / 1e9);
  }
  return rates;
}
std::vector<double> fma_rates(int threads, int runs) {
  return ceiling_rates(fma_loop, kChains * 2.0 * kLanes, threads, runs);
}
std::vector<double> dpbf16_rates(int threads, int runs) {
  return ceiling_rates(dpbf16_loop, kBf16Chains * 4.0 * 16, threads, runs);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- GEMM through loom ------------------------------------------------------------------
struct Stats { double best, median; };

// C [M, N] = op(A) @ op(B) in `dtype`; a transposed operand is stored transposed and viewed back.
Stats time_matmul(int64_t M, int64_t K, int64_t N, bool ta, bool tb, loom::DType dtype, int repeats) {
  loom::Generator gen(0);
  auto randn = [&](loom::Shape shape) { return loom::ops::to(loom::randn(shape, gen), dtype); };
  loom::Tensor a = ta ? loom::ops::transpose(randn({K, M}), 0, 1) : randn({M, K});
  loom::Tensor b = tb ? loom::ops::transpose(randn({N, K}), 0, 1) : randn({K, N});
  const double flops = 2.0 * double(M) * double(K) * double(N);
  for (int w = 0; w < 2; ++w) loom::ops::matmul(a, b);  // warm up: JIT kernels, page faults
  std::vector<double> gflops;
  auto start = Clock::now();
  // At least `repeats` runs, and keep going up to ~0.5 s for the smaller shapes.
  for (int r = 0; r < repeats || (seconds_since(start) < 0.5 && r < 20000); ++r) {
    auto t0 = Clock::now();
    loom::Tensor c = loom::ops::matmul(a, b);
    gflops.push_back(flops / seconds_since(t0) / 1e9);
  }
  return {*std::max_element(gflops.begin(), gflops.end()), median(gflops)};
}

}  // namespace

// One column of the table: the fp32 library, the dtype, the bf16 path, and
// which ceiling its % is of.
struct Column {
  std::string name, library, bf16_mode;
  loom::DType dtype;
  bool bf16_ceiling;
};

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int repeats = quick ? 3 : 10;
  struct Case { int64_t M, K, N; bool ta, tb; };
  std::vector<Case> cases = {{64, 32, 64, false, true}, {64, 64, 32, false, false}, {512, 512, 512, false, false}};
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 1024}, {2048, 768, 3072}})
    for (int t = 0; t < 4; ++t) cases.push_back({M, K, N, t >= 2, t % 2 == 1});
  std::vector<Column> columns = {{"onednn", "onednn", "fp32", loom::kFloat32, false},
                                 {"openblas", "openblas", "fp32", loom::kFloat32, false},
                                 {"bf16", "onednn", "bf16", loom::kBFloat16, true},
                                 {"bf16 via fp32", "onednn", "fp32", loom::kBFloat16, false}};
  try {
    loom::ops::set_gemm_library("onednn");
  } catch (const std::exception&) {  // built without oneDNN: OpenBLAS, and bf16 by conversion on it
    columns = {{"openblas", "openblas", "fp32", loom::kFloat32, false},
               {"bf16 via fp32", "openblas", "fp32", loom::kBFloat16, false}};
  }
  const std::string bf16_before = loom::ops::bf16_gemm();
  try {
    loom::ops::set_bf16_gemm("bf16");
  } catch (const std::exception&) {  // no AVX512_BF16 or AMX here: no native column
    columns.erase(std::remove_if(columns.begin(), columns.end(), [](const Column& c) { return c.bf16_mode == "bf16"; }),
                  columns.end());
  }

  std::printf("bench_gemm: loom::ops::matmul vs the %s FMA ceiling (%d chains x %d lanes)%s\n", kIsa, kChains, kLanes,
              kBf16Ceiling ? " and the vdpbf16ps ceiling" : "");
  double load = 0;
  std::ifstream("/proc/loadavg") >> load;
  std::printf("1-min load average %.2f (anything else running lowers both the GEMM and the ceiling)\n", load);
  std::printf("%-7s %-14s %-3s %8s %8s", "threads", "M x K x N", "op", "ceiling", "bf16 ceil");
  for (const Column& c : columns) std::printf(" | %-13s %6s %6s %6s", c.name.c_str(), "best", "median", "best%");
  std::printf("   (GF/s; %% of the column's ceiling)\n");
  double ceiling_1 = 0;  // the 1-thread ceiling, to check that 2 threads get 2 cores
  for (int threads : {1, 2}) {
    loom::ops::set_num_threads(threads);
    // The ceiling is the sustained FMA rate: the median of runs before and after
    // the GEMMs (short clock bursts and busy moments fall outside the median).
    std::vector<double> rates = fma_rates(threads, quick ? 3 : 8), bf16_rates;
    if (kBf16Ceiling) bf16_rates = dpbf16_rates(threads, quick ? 3 : 8);
    std::vector<std::vector<Stats>> stats(cases.size());
    for (size_t i = 0; i < cases.size(); ++i)
      for (const Column& col : columns) {
        loom::ops::set_gemm_library(col.library);
        loom::ops::set_bf16_gemm(col.bf16_mode);
        const Case& c = cases[i];
        stats[i].push_back(time_matmul(c.M, c.K, c.N, c.ta, c.tb, col.dtype, repeats));
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (double r : fma_rates(threads, quick ? 3 : 8)) rates.push_back(r);
    if (kBf16Ceiling)
      for (double r : dpbf16_rates(threads, quick ? 3 : 8)) bf16_rates.push_back(r);
    const double ceiling = median(rates), bf16_ceiling = kBf16Ceiling ? median(bf16_rates) : 2 * ceiling;
    const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
    if (*hi - *lo > 0.15 * ceiling)
      std::printf("warning: the FMA ceiling varied from %.0f to %.0f GF/s: the machine is busy, numbers are noisy\n",
                  *lo, *hi);
    if (threads == 2 && ceiling < 1.7 * ceiling_1)
      std::printf("warning: 2 threads reach only %.2fx the 1-thread FMA ceiling: another process holds a core\n",
                  ceiling / ceiling_1);
    if (threads == 1) ceiling_1 = ceiling;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      char dims[48], op[4] = {c.ta ? 'T' : 'N', c.tb ? 'T' : 'N', 0, 0};
      std::snprintf(dims, sizeof(dims), "%lldx%lldx%lld", (long long)c.M, (long long)c.K, (long long)c.N);
      std::printf("%-7d %-14s %-3s %8.1f %8.1f", threads, dims, op, ceiling, bf16_ceiling);
      for (size_t j = 0; j < columns.size(); ++j) {
        const Stats& st = stats[i][j];
        std::printf(" | %-13s %6.1f %6.1f %5.1f%%", "", st.best, st.median,
                    100 * st.best / (columns[j].bf16_ceiling ? bf16_ceiling : ceiling));
      }
      std::printf("\n");
    }
  }
  loom::ops::set_gemm_library(columns.front().library);
  loom::ops::set_bf16_gemm(bf16_before);
  std::printf("target (issue 19): >= 85%% of the ceiling for 1024^3 and 2048x768x3072, 1 and 2 threads\n");
  std::printf("bf16 ceiling: %s\n", kBf16Ceiling ? "measured (vdpbf16ps chains)"
                                                 : "2x the FMA ceiling (not built with AVX512_BF16 to measure it)");
  return 0;
}
