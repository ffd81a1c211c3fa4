// Column sums over many rows in two deterministic passes, for the fast
// layer-norm weight/bias gradients (tensor/cuda/fast/layernorm_fast.cu):
//   dw[c] = sum over rows r of term(r, c)    (rows = B*T, e.g. 16384; C = 768)
// The reference kernel gives each column one thread that walks every row:
// C threads, too few to fill a GPU. Here:
//   pass 1: the rows are cut into blocks of `rows_per_block`; block b's thread for
//           column c adds its rows in row order -> partial[b][c]   (blocks x C threads)
//   pass 2: column c adds partial[0][c], partial[1][c], ... in block order.
// No float atomics, so the order depends only on (rows, rows_per_block): the
// same bits on every run and every GPU. With one block the result is the
// row-order sum, bit for bit (the reference's); with more blocks it is the
// sum of the blocks' sums, a different rounding of the same sum. The CPU's
// layer_norm_backward (ops_nn.cpp) sums in this order too, so that its
// threads can each take whole blocks and still give the same bits.
#pragma once

#include "tensor/macros.h"

namespace loom::kernels {

constexpr long kRowsPerPartial = 64;  // 16384 rows -> 256 partials per column

LOOM_HOST_DEVICE long partial_blocks(long rows, long rows_per_block) {
  return (rows + rows_per_block - 1) / rows_per_block;
}

// Pass 1: sum of term(r) over block b's rows, in row order.
template <class T, class Term>
LOOM_HOST_DEVICE T block_column_sum(long b, long rows, long rows_per_block, Term term) {
  const long r0 = b * rows_per_block, r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  T s = T(0);
  for (long r = r0; r < r1; ++r) s += term(r);
  return s;
}

// Pass 2: column c of partial [blocks, C], summed in block order.
template <class T>
LOOM_HOST_DEVICE T sum_of_partials(const T* partial, long blocks, long C, long c) {
  T s = T(0);
  for (long b = 0; b < blocks; ++b) s += partial[b * C + c];
  return s;
}

}  // namespace loom::kernels
