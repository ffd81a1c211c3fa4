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
// Usage: bench_gemm [--quick] [--cold] [--shape MxKxN]...   (--quick: fewer repeats, for a smoke run;
// --cold: the caches evicted before each timed product; --shape: that product as NN, NT, TN and TT instead
// of the default cases, e.g. a GPT's linear layers: bench/README.md)
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

#include "bench/ceiling.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom::bench;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- GEMM through loom ------------------------------------------------------------------
struct Stats { double best, median; };

// --cold: before each timed product, 64 MB written a cache line at a time, so that A and B come from memory
// as they do in a training step (each linear's operands last touched a layer or more earlier), not from a
// cache warmed by the run before.
bool g_cold = false;
void evict_caches() {
  static std::vector<float> junk(size_t(16) << 20);
  for (size_t i = 0; i < junk.size(); i += 16) junk[i] += 1.0f;
}

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
    if (g_cold) evict_caches();
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
  bool quick = false;
  struct Case { int64_t M, K, N; bool ta, tb; };
  std::vector<Case> shapes;  // --shape MxKxN: that product as NN, NT, TN and TT instead of the default cases
  for (int i = 1; i < argc; ++i) {
    long long M = 0, K = 0, N = 0;
    char end = 0;
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--cold") == 0) {
      g_cold = true;
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc &&
               std::sscanf(argv[i + 1], "%lldx%lldx%lld%c", &M, &K, &N, &end) == 3 && M > 0 && K > 0 && N > 0) {
      for (int t = 0; t < 4; ++t) shapes.push_back({M, K, N, t >= 2, t % 2 == 1});
      ++i;
    } else {
      std::fprintf(stderr, "bench_gemm: unknown or malformed argument '%s' (usage: bench_gemm [--quick] [--cold] "
                   "[--shape MxKxN]..., M, K, N positive)\n", argv[i]);
      return 2;
    }
  }
  const int repeats = quick ? 3 : 10;
  std::vector<Case> cases = {{64, 32, 64, false, true}, {64, 64, 32, false, false}, {512, 512, 512, false, false}};
  for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1024, 1024, 1024}, {2048, 768, 3072}})
    for (int t = 0; t < 4; ++t) cases.push_back({M, K, N, t >= 2, t % 2 == 1});
  if (!shapes.empty()) cases = shapes;
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
  if (g_cold) std::printf("--cold: 64 MB written before each timed product (operands from memory)\n");
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
