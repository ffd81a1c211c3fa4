// Internal to tensor/: software prefetch of a block of rows into L2, for an
// op that walks independent items and knows the next one's operands while it
// computes this one (causal attention's heads, or a large head's next block
// of rows: tensor/ops_attention.cpp).
//
// Why: the hardware prefetchers follow a stream once it has started; a head's
// q, k, v are 64 short rows (128 bytes, 1,536 bytes apart inside qkv), its
// probabilities a fresh 16 KB and its outputs rows that a store must first
// read in, each begun cold when the head starts, so the head's products wait
// for memory. Asked for one head ahead, the lines arrive while the current
// head computes (bench/README.md, issue 47).
#pragma once

#include <cstdint>

namespace loom::cpu {

// Every 64-byte line of rows [0, rows) x elements [0, cols) at p, rows `ld` elements apart, into L2
// (locality 2: prefetcht1 on x86), each line once (rows that do not start on a line take one more).
// A hint only: no fault, no effect on any value.
// kWrite: the lines are about to be written (prefetchw: fetched for ownership, so the store need not ask again;
// where the build's ISA lacks PRFCHW, x86-64-v3 among them, the compiler emits the read prefetch instead).
template <bool kWrite = false, class T>
inline void prefetch_rows(const T* p, int64_t ld, int64_t rows, int64_t cols) {
  if (ld == cols) {  // contiguous: one range
    cols *= rows;
    rows = 1;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p + r * ld), end = begin + uintptr_t(cols) * sizeof(T);
    for (uintptr_t line = begin & ~uintptr_t(63); line < end; line += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(line), kWrite ? 1 : 0, 2);
  }
}

}  // namespace loom::cpu
