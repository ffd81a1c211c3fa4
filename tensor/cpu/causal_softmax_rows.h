// Internal to tensor/: the softmax rows of one block of causal attention's
// scores on the CPU (tensor/ops_attention.cpp), forward and backward, the
// fast twins of kernels::causal_softmax_row and causal_softmax_backward_row
// (tensor/kernels/softmax.h), which stay the reference and what every other
// caller runs. Row i of the block:
//
//   y[j]  = softmax_j(scale * x[j]) over j < visible0 + i,  0 past it
//   dx[j] = scale * y[j] * (dy[j] - sum_k dy[k] y[k])        on the same j, 0 past it
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
// The backward likewise: every row's sum, then every row's dx. Measured on
// the small GPT (256 blocks of 64 rows a step, 16,384 rows; bench/README.md,
// issue 47): forward AVX2 ~0.97 -> ~0.56 ms a step, AVX-512 ~1.0 -> ~0.45;
// backward AVX2 ~0.55 -> ~0.35, AVX-512 ~0.38 -> ~0.19.
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
//
// The backward is within rounding of its reference, not its bits: the
// reference's sum(dy * y) (row_sum over `j < visible ? dy * y : 0`) is
// compiled by GCC 12 -O3 with an FMA on some of the 16 lanes and a rounded
// product on others, and differently at AVX2 and AVX-512, so no fixed order of
// operations gives its bits. Here every product is rounded once, then added
// (no FMA), in row_sum's lanes and tree; the test bounds the difference by
// the sum's rounding (tests/test_causal_softmax_rows.cpp).
#pragma once

#include <cstdint>

namespace loom::cpu {

// Rows [0, rows) of a block: row i at x + i * ld (and y + i * ld; y may be x), n values, of which the
// first visible0 + i (>= 1) are seen. fp64 (gradient checks) runs the reference on every row.
void causal_softmax_rows(const float* x, float* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0, float scale);
void causal_softmax_rows(const double* x, double* y, int64_t ld, int64_t rows, int64_t n, int64_t visible0,
                         double scale);

// Its backward (kernels::causal_softmax_backward_row) on the rows of a block: dx = scale * y * (dy - sum(dy * y))
// on the visible values, 0 past them; dx may be dy. Within rounding of the reference, not its bits (see above).
void causal_softmax_backward_rows(const float* dy, int64_t ld_dy, const float* y, int64_t ld_y, float* dx,
                                  int64_t ld_dx, int64_t rows, int64_t n, int64_t visible0, float scale);
void causal_softmax_backward_rows(const double* dy, int64_t ld_dy, const double* y, int64_t ld_y, double* dx,
                                  int64_t ld_dx, int64_t rows, int64_t n, int64_t visible0, double scale);

}  // namespace loom::cpu
