// Internal to tensor/: GELU and its backward over a contiguous run of floats
// at AVX2, the fast twins of kernels::gelu and kernels::gelu_backward
// (tensor/kernels/gelu.h), which stay the reference and what every other
// path runs (fp64, AVX-512, no AVX2, the ends of a run).
//
// What it does that the reference loop does not. Each value is one long
// dependent chain (x^3, exp_approx's polynomial, the division), ~35 vector
// instructions of which few are independent; GCC's loop runs one vector of 8
// at a time, so the core overlaps consecutive vectors only as far as its
// schedulers reach: at AVX2, ~2.5 cycles a value (~20 a vector of 8), about
// twice what its arithmetic needs. Here 4 vectors (32 values) go
// statement by statement, so four chains are always in flight. Outside loom
// (one thread, 64 rows of 1536 in L1, Zen 4 held to AVX2): forward 71 -> 63 us,
// backward 96 -> 78 us (bench/README.md, issue 47).
//
// Numbers: the reference's operations in its order, with an FMA exactly where
// GCC and clang contract the reference (checked by `objdump` of the reference
// loop; the same contractions as causal_softmax_rows.cpp's exp_approx8): the
// same bits for every float (tests/test_gelu_vec.cpp; all 2^32 inputs were
// checked once outside the suite). AVX-512 keeps the compiler's 16-lane loop:
// there its chains were not measured to be the limit. Compiled in the library
// (gelu_vec.cpp), as causal_softmax_rows.cpp is, so that the reference it
// must match (the runs' ends, and every other caller's loop) is always
// compiled with the library's flags, never a caller's.
#pragma once

#include <cstdint>

namespace loom::cpu {

// Values go 32 at a time (4 vectors of 8), the reference takes a run's last n % 32. A run split at multiples
// of this gives every value the path it had in the whole run, so any split (threads) gives the same bits even
// where the two paths round apart (a GCC -O0/-O1 library: tests/test_gelu_vec.cpp).
constexpr int64_t kGeluRunStep = 32;

// y[j] = kernels::gelu(x[j]), j < n; y may be x. fp64 (gradient checks) runs the reference.
void gelu_run(const float* x, float* y, int64_t n);
void gelu_run(const double* x, double* y, int64_t n);

// out[j] = kernels::gelu_backward(g[j], x[j]), j < n; out may be g.
void gelu_backward_run(const float* g, const float* x, float* out, int64_t n);
void gelu_backward_run(const double* g, const double* x, double* out, int64_t n);

}  // namespace loom::cpu
