// bench_gemm: fp32 GEMM throughput of loom::ops::matmul on oneDNN and on
// OpenBLAS, beside this machine's FMA ceiling, measured by the same program.
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

// GFLOP/s of `threads` threads each running the FMA loop, one entry per run
// (~40 ms each, after one warm-up run that brings the core to its AVX-512 clock).
std::vector<double> fma_rates(int threads, int runs) {
  const int64_t iters = 15'000'000;
  const double flops_per_thread = double(iters) * kChains * kLanes * 2;
  std::vector<double> rates;
  volatile float sink = 0;
  for (int r = 0; r < runs + 1; ++r) {
    std::vector<float> out(static_cast<size_t>(threads), 0.0f);
    auto t0 = Clock::now();
    if (threads == 1) {
      out[0] = fma_loop(iters);
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { out[size_t(t)] = fma_loop(iters); });
      for (auto& th : pool) th.join();
    }
    double s = seconds_since(t0);
    for (float x : out) sink = sink + x;
    if (r > 0) rates.push_back(flops_per_thread * threads / s / 1e9);
  }
  return rates;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- GEMM through loom ------------------------------------------------------------------
struct Stats { double best, median; };

// C [M, N] = op(A) @ op(B); a transposed operand is stored transposed and viewed back.
Stats time_matmul(int64_t M, int64_t K, int64_t N, bool ta, bool tb, int repeats) {
  loom::Generator gen(0);
  loom::Tensor a = ta ? loom::ops::transpose(loom::randn({K, M}, gen), 0, 1) : loom::randn({M, K}, gen);
  loom::Tensor b = tb ? loom::ops::transpose(loom::randn({N, K}, gen), 0, 1) : loom::randn({K, N}, gen);
  const double flops = 2.0 * double(M) * double(K) * double(N);
  for (int w = 0; w < 2; ++w) loom::ops::matmul(a, b);  // warm up: JIT kernels, page faults
  std::vector<double> gflops;
  auto start = Clock::now();
  // At least `repeats` runs, and keep going up to ~0.5 s for the smaller shapes.
  for (int r = 0; r < repeats || (seconds_since(start) < 0.5 && r < 200); ++r) {
    auto t0 = Clock::now();
    loom::Tensor c = loom::ops::matmul(a, b);
    gflops.push_back(flops / seconds_since(t0) / 1e9);
  }
  return {*std::max_element(gflops.begin(), gflops.end()), median(gflops)};
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int repeats = quick ? 3 : 10;
  struct Case { int64_t M, K, N; bool ta, tb; };
  std::vector<Case> cases = {{512, 512, 512, false, false}};
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 1024}, {2048, 768, 3072}})
    for (int t = 0; t < 4; ++t) cases.push_back({M, K, N, t >= 2, t % 2 == 1});
  std::vector<std::string> libraries = {"onednn", "openblas"};
  try {
    loom::ops::set_gemm_library("onednn");
  } catch (const std::exception&) {
    libraries = {"openblas"};  // built without oneDNN
  }

  std::printf("bench_gemm: fp32 loom::ops::matmul vs the %s FMA ceiling (%d chains x %d lanes)\n", kIsa, kChains,
              kLanes);
  double load = 0;
  std::ifstream("/proc/loadavg") >> load;
  std::printf("1-min load average %.2f (anything else running lowers both the GEMM and the ceiling)\n", load);
  std::printf("%-7s %-14s %-3s %9s", "threads", "M x K x N", "op", "ceiling");
  for (const std::string& lib : libraries) std::printf(" %9s %9s %8s", (lib + " best").c_str(), "median", "best %");
  std::printf("   (GF/s; %% of the ceiling)\n");
  double ceiling_1 = 0;  // the 1-thread ceiling, to check that 2 threads get 2 cores
  for (int threads : {1, 2}) {
    loom::ops::set_num_threads(threads);
    // The ceiling is the sustained FMA rate: the median of runs before and after
    // the GEMMs (short clock bursts and busy moments fall outside the median).
    std::vector<double> rates = fma_rates(threads, quick ? 3 : 8);
    std::vector<std::vector<Stats>> stats(cases.size());
    for (size_t i = 0; i < cases.size(); ++i)
      for (const std::string& lib : libraries) {
        loom::ops::set_gemm_library(lib);
        const Case& c = cases[i];
        stats[i].push_back(time_matmul(c.M, c.K, c.N, c.ta, c.tb, repeats));
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (double r : fma_rates(threads, quick ? 3 : 8)) rates.push_back(r);
    const double ceiling = median(rates);
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
      std::printf("%-7d %-14s %-3s %9.1f", threads, dims, op, ceiling);
      for (const Stats& st : stats[i]) std::printf(" %9.1f %9.1f %7.1f%%", st.best, st.median, 100 * st.best / ceiling);
      std::printf("\n");
    }
  }
  loom::ops::set_gemm_library(libraries.front());
  std::printf("target (issue 19): >= 85%% of the ceiling for 1024^3 and 2048x768x3072, 1 and 2 threads\n");
  return 0;
}
