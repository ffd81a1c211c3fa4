// The small products of causal attention's blocks (tensor/cpu/small_gemm.h):
// the fast path (vector tiles at this build's instruction set, edge loops,
// the causal skips) gives the reference's bits, on every size from 1 to past
// two tiles in each direction (odd ones included), A stored and transposed,
// beta 0 and 1, and each of the three skips with A holding the zeros it
// assumes. tests/avx2.sh runs it at x86-64-v3, where the tiles are 8 lanes.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tensor/cpu/small_gemm.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;
using cpu::Skip;
using cpu::SmallA;

namespace {

std::vector<float> random(int64_t n, uint64_t seed) {
  Generator g(seed);
  return randn({n}, g).to_vector<float>();
}

struct Product {
  int64_t M, N, K;
  bool transposed_a, beta_one;
};

// A (stored [M, K] or, transposed, [K, M]), with zeros wherever `skip` says
// A is zero; B [K, N]; C's start; then reference and fast path on copies of C.
// Where skip.j_end leaves C(i, j) unneeded, those elements are not compared.
int64_t expect_same_bits(const Product& p, Skip skip, uint64_t seed) {
  // Rows padded, so that a write past N or a wrong stride shows.
  const int64_t lda = p.transposed_a ? p.M + 3 : p.K + 1, ldb = p.N + 2, ldc = p.N + 5;
  std::vector<float> a = random((p.transposed_a ? p.K : p.M) * lda, seed);
  const std::vector<float> b = random(p.K * ldb, seed + 1), c0 = random(p.M * ldc, seed + 2);
  const SmallA<float> A{a.data(), p.transposed_a ? 1 : lda, p.transposed_a ? lda : 1};
  int64_t zeros = 0;
  for (int64_t i = 0; i < p.M; ++i)
    for (int64_t k = 0; k < p.K; ++k)
      if (k < skip.k_lo(i, p.K) || k >= skip.k_hi(i, p.K)) {
        a[i * A.si + k * A.sk] = 0.0f;
        ++zeros;
      }
  std::vector<float> ref = c0, got = c0;
  cpu::small_gemm_reference<float>(p.M, p.N, p.K, A, b.data(), ldb, ref.data(), ldc, p.beta_one);
  cpu::small_gemm<float>(p.M, p.N, p.K, A, b.data(), ldb, got.data(), ldc, p.beta_one, skip);
  int64_t compared = 0, differ = 0, padding_written = 0;
  for (int64_t i = 0; i < p.M; ++i) {
    for (int64_t j = 0; j < skip.j_hi(i, p.N); ++j, ++compared) differ += got[i * ldc + j] != ref[i * ldc + j];
    for (int64_t j = p.N; j < ldc; ++j) padding_written += std::memcmp(&got[i * ldc + j], &c0[i * ldc + j], 4) != 0;
  }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(differ, 0) << "elements of C that differ from the reference, of " << compared;
  EXPECT_EQ(padding_written, 0) << "elements between C's rows written";
  return zeros;  // of A, where the skip allows leaving terms out
}

// 1 to 2 tiles + 1 of rows (6 a tile) and past two pairs of AVX-512 vectors
// (32 columns a pair) in columns, K from 1 to 70.
const int64_t kSizes[] = {1, 2, 5, 6, 7, 13, 16, 17, 31, 32, 33, 48, 64, 65, 70};

}  // namespace

TEST(SmallGemm, SameBitsAsTheReferenceOnEverySize) {
  uint64_t seed = 1;
  for (int64_t M : kSizes)
    for (int64_t N : kSizes)
      for (int64_t K : {int64_t(1), int64_t(3), int64_t(8), int64_t(32), int64_t(70)})
        for (bool ta : {false, true})
          for (bool beta : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K << (ta ? " Aᵀ" : "")
                                              << (beta ? " beta 1" : " beta 0"));
            expect_same_bits({M, N, K, ta, beta}, Skip{}, seed++);
          }
}

// Attention's three skips, as ops_attention.cpp uses them: on a diagonal
// block (offset 0) and on a block whose keys start before its queries (r0 of
// 64 and 128: the block's query i is query r0 + i).
TEST(SmallGemm, CausalSkipsGiveTheReferenceBits) {
  uint64_t seed = 100;
  int64_t zeros_after = 0, zeros_before = 0;  // A's zeros in the k_end and k_begin cases
  for (int64_t r0 : {int64_t(0), int64_t(64), int64_t(128)})
    for (int64_t m : {int64_t(1), int64_t(7), int64_t(64)})
      for (int64_t hd : {int64_t(4), int64_t(12), int64_t(32), int64_t(64)}) {
        const int64_t r1 = r0 + m;  // keys 0..r1
        SCOPED_TRACE(::testing::Message() << "r0=" << r0 << " m=" << m << " hd=" << hd);
        // S = q kᵀ [m, r1], hd long, not needed past the diagonal
        expect_same_bits({m, r1, hd, false, false}, Skip::unneeded_after(r0), seed++);
        // y = P v [m, hd] and dq = dS k: P(i, s) == 0 for s > r0 + i
        zeros_after += expect_same_bits({m, hd, r1, false, false}, Skip::zeros_after(r0), seed++);
        // dv += Pᵀ dy, dk += dSᵀ q [r1, hd]: Pᵀ(s, i) == 0 for i < s - r0
        zeros_before += expect_same_bits({r1, hd, m, true, r0 > 0}, Skip::zeros_before(-r0), seed++);
      }
  EXPECT_GT(zeros_after, 0);  // the cases hold zeros to skip
  EXPECT_GT(zeros_before, 0);
}

// The fast transpose (8 x 8 blocks, the edges by the reference) writes every
// element where the reference does, and nothing past cols x rows: sizes with
// and without whole blocks, the small GPT's kᵀ (64 x 32, rows 384 apart).
TEST(SmallGemm, TransposeIntoWritesEveryElement) {
  for (int64_t rows : {1, 7, 8, 13, 16, 64})
    for (int64_t cols : {1, 5, 8, 12, 32, 33}) {
      SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
      const int64_t ldi = rows == 64 ? 384 : cols + 3, ldo = rows + 2;
      const std::vector<float> in = random(rows * ldi, uint64_t(rows * 100 + cols));
      std::vector<float> out(size_t(cols * ldo), -1.0f), want(size_t(cols * ldo), -1.0f);
      cpu::transpose_into(in.data(), ldi, rows, cols, out.data(), ldo);
      cpu::transpose_into_reference(in.data(), ldi, rows, cols, want.data(), ldo);
      EXPECT_EQ(out, want);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(out[c * ldo + r], in[r * ldi + c]) << r << ", " << c;
    }
}
