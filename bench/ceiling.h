// This machine's ceilings, measured by the benchmark that sets numbers beside
// them: the FMA rate of one core (or `threads`) and the bandwidth of a copy
// too large for the caches. bench_gemm and bench_gpt_step --profile share them.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "tensor/profile.h"

namespace loom::bench {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- FMA ceiling ------------------------------------------------------------------
// kChains independent accumulators: FMA latency is 4 cycles and a core issues
// up to 2 FMAs a cycle, so >= 8 chains keep both ports busy; 12 leaves slack.
constexpr int kChains = 12;
#if defined(__AVX512F__)
constexpr int kLanes = 16;
inline const char* kIsa = "AVX-512";
using Vec = __m512;
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
#else
constexpr int kLanes = 8;
inline const char* kIsa = "AVX2";
using Vec = __m256;
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
#endif

// Runs `iters` rounds of kChains FMAs; returns a value so the work is not elided.
inline float fma_loop(int64_t iters) {
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
inline float dpbf16_loop(int64_t iters) {
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
inline float dpbf16_loop(int64_t) { return 0; }
#endif

// GFLOP/s of `threads` threads each running `loop` (fma_loop: kChains x 2 x
// kLanes FLOP per iteration; dpbf16_loop: kBf16Chains x 4 x 16), one entry per
// run (~40 ms each, after one warm-up run that brings the core to its AVX-512 clock).
inline std::vector<double> ceiling_rates(float (*loop)(int64_t), double flops_per_iter, int threads, int runs) {
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
inline std::vector<double> fma_rates(int threads, int runs) {
  return ceiling_rates(fma_loop, kChains * 2.0 * kLanes, threads, runs);
}
inline std::vector<double> dpbf16_rates(int threads, int runs) {
  return ceiling_rates(dpbf16_loop, kBf16Chains * 4.0 * 16, threads, runs);
}

// One core's FMA rate in GF/s of this thread's CPU time (not the wall's):
// what the core does while it runs this thread, whatever else the machine
// runs - the ceiling beside an op's CPU time (tensor/profile.h). Best of `runs`.
inline double fma_rate_cpu_time(int runs = 3) {
  auto cpu = profile::thread_cpu_seconds;
  const int64_t iters = 15'000'000;
  volatile float sink = fma_loop(iters / 10);  // brings the core to its vector clock
  double best = 0;
  for (int r = 0; r < runs; ++r) {
    const double t0 = cpu();
    sink = sink + fma_loop(iters);
    best = std::max(best, double(iters) * kChains * 2.0 * kLanes / (cpu() - t0) / 1e9);
  }
  return best;
}

// GB/s of a copy of 256 MiB (read + write counted), `threads` threads each
// copying its share, the best of `runs`: the bandwidth an op that streams
// through memory can hope for.
inline double copy_bandwidth_gbs(int threads, int runs = 5) {
  const size_t n = size_t(64) << 20;  // floats: 256 MiB a side
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 0;
  for (int r = 0; r < runs; ++r) {
    auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t lo = n * size_t(t) / size_t(threads), hi = n * size_t(t + 1) / size_t(threads);
        std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * sizeof(float));
      });
    for (auto& th : pool) th.join();
    best = std::max(best, 2.0 * double(n * sizeof(float)) / seconds_since(t0) / 1e9);
  }
  return best + 0.0 * double(b[n / 2]);  // b read: the copy is not elided
}

}  // namespace loom::bench
