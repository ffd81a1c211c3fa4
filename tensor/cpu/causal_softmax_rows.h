// Internal to tensor/: the softmax rows of one block of causal attention's
// scores on the CPU (tensor/ops_attention.cpp), the fast twin of
// kernels::causal_softmax_row (tensor/kernels/softmax.h), which stays the
// reference and what every other caller runs. Row i of the block:
//
//   y[j] = softmax_j(scale * x[j]) over j < visible0 + i,  0 past it
//
// What it does that the reference does not. The small GPT's rows are short
// (T = 64: 16, 32, 48 or 64 values once rounded up to the 16 lanes), and one
// row is a chain: max -> exp -> sum -> 1 / sum. The reference runs it one row
// at a time in five loops whose lengths the compiler cannot see (a vector
// loop each, with its remainder code), and GCC 12 at AVX2 left row_max's 16
// lanes in memory, one float at a time. Here each row goes by whole blocks of
// 16 values in AVX registers (two of 8 lanes), and the block's rows go phase
// by phase, so the rows' chains overlap in the core:
//   1. s = scale * x (visible) or -inf, written to y; the 16 lanes' maxima; m
//   2. y = exp(s - m); the 16 lanes' sums; inv = 1 / sum
//   3. y *= inv; zeros past the row's last block
// Measured on the small GPT (256 blocks of 64 rows a step, 16,384 rows): AVX2
// ~0.97 -> ~0.56 ms a step, AVX-512 ~1.0 -> ~0.45 ms (bench/README.md, issue 47).
//
// Numbers: the reference's operations in its order, so its bits (compiled
// with FMA: tests/test_causal_softmax_rows.cpp compares with the library's
// ops::causal_softmax): x * scale rounded once; the maxima lane by lane (lane
// k sees values k, k + 16, ...) and row_sum.h's tree (k with k + 8, + 4, + 2,
// + 1; max as `b > a ? b : a`, which is what maxps does); exp_approx's
// statements with an FMA where each statement has its multiply-add (what GCC
// and clang contract them into); the sums' 16 lanes and the same tree. A row
// whose values are not whole blocks of 16 (shorter than 16, or ending at n
// where n % 16 != 0) runs the reference. Without AVX2 and FMA, and in fp64,
// every row runs the reference.
#pragma once

#include <cstdint>

namespace loom::cpu {

// Rows [0, rows) of a block: row i at x + i * ld (and y + i * ld; y may be x), n values, of which the
// first visible0 + i (>= 1) are seen. fp64 (gradient checks) runs the reference on every row.
void causal_softmax_rows(const float* x, float* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0, float scale);
void causal_softmax_rows(const double* x, double* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0,
                         double scale);

}  // namespace loom::cpu
