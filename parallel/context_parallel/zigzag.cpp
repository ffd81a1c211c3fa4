#include "parallel/context_parallel/zigzag.h"

#include "tensor/ops.h"

namespace loom::parallel {

void check_zigzag_split(int64_t T, int cp) {
  LOOM_CHECK(cp >= 1 && T % (2 * int64_t(cp)) == 0, "--cp ", cp, " cuts each sequence into 2 x cp = ", 2 * int64_t(cp),
             " equal chunks (the zig-zag split), but --block ", T, " is not divisible by ", 2 * int64_t(cp),
             "; pick a sequence length that is a multiple of ", 2 * int64_t(cp));
}

Tensor zigzag_positions(int64_t T, int cp, int r) {
  check_zigzag_split(T, cp);
  const int64_t c = T / (2 * cp);
  std::vector<int64_t> pos;
  for (int64_t chunk : {int64_t(r), int64_t(2 * cp - 1 - r)})
    for (int64_t i = 0; i < c; ++i) pos.push_back(chunk * c + i);
  return from_vector(pos);
}

std::vector<int64_t> zigzag_chunk_starts(int64_t T, int cp, int r) {
  check_zigzag_split(T, cp);
  const int64_t c = T / (2 * cp);
  return {r * c, (2 * cp - 1 - r) * c};
}

std::array<int64_t, 2> zigzag_chunks(int r, int cp) { return {r, 2 * cp - 1 - r}; }

std::vector<ZigzagBlock> zigzag_blocks(int r, int src, int cp) {
  std::vector<ZigzagBlock> blocks;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      const int64_t qc = zigzag_chunks(r, cp)[size_t(i)], kc = zigzag_chunks(src, cp)[size_t(j)];
      if (kc <= qc) blocks.push_back({i, j, qc, kc, kc == qc});
    }
  return blocks;
}

Tensor zigzag_take(const Tensor& x, int64_t dim, int cp, int r) {
  if (cp == 1) return x;  // one rank holds the whole sequence, any length
  if (dim < 0) dim += x.dim();
  check_zigzag_split(x.size(dim), cp);
  const int64_t c = x.size(dim) / (2 * cp);
  return ops::cat({ops::narrow(x, dim, r * c, c), ops::narrow(x, dim, (2 * cp - 1 - r) * c, c)}, dim);
}

}  // namespace loom::parallel
