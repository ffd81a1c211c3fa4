// The tensor-core flash attention (tensor/cuda/fast/flash_attention_mma.cu)
// on the CPU: its fragment indexing (tensor/kernels/mma_fragment.h) and its
// per-lane math (tensor/kernels/flash_attention_mma.h), run for 32 simulated
// lanes with a model of the mma instruction written from the PTX ISA's tables
// (mma_warp_model.h), against plain matrix products and against loom's CPU
// flash attention. No GPU: this is what checks the kernel's indexing here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "mma_warp_model.h"
#include "tensor/flash_attention.h"
#include "tensor/generator.h"
#include "tensor/kernels/flash_attention_mma.h"
#include "tensor/ops.h"

using namespace loom;
namespace mma = loom::kernels::mma;
namespace fm = loom::kernels::flash_mma;
namespace wm = loom::test::warp_model;
constexpr int kLanes = wm::kLanes;

namespace {

// Random values rounded to the 16-bit type S, as raw bits.
template <class S>
std::vector<uint16_t> random_bits(size_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<float> x = randn({int64_t(n)}, g).to_vector<float>();
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = mma::round_bits<S>(x[i]);
  return bits;
}

// The layout covers its [rows x cols] matrix, each element held by exactly one (lane, element).
template <class Row, class Col>
void expect_covers_once(int rows, int cols, int elements, Row row, Col col) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < kLanes; ++lane)
    for (int e = 0; e < elements; ++e) {
      const int r = row(lane, e), c = col(lane, e);
      EXPECT_TRUE(r >= 0 && r < rows && c >= 0 && c < cols) << "lane " << lane << " element " << e;
      EXPECT_TRUE(seen.insert({r, c}).second) << "(" << r << ", " << c << ") twice, lane " << lane;
    }
  EXPECT_EQ(seen.size(), size_t(rows * cols));
}

}  // namespace

TEST(MmaFragment, EachLayoutHoldsEveryElementOnce) {
  expect_covers_once(16, 16, 8, mma::a_row, mma::a_col);
  expect_covers_once(16, 8, 4, mma::b_row, mma::b_col);
  expect_covers_once(16, 8, 4, mma::c_row, mma::c_col);
}

// A [16 x 16] and B [16 x 8] in padded row-major tiles, as the kernel keeps
// them in shared memory; B both as it is (V for P V) and transposed (K for
// Q Kᵀ). The lanes load their fragments with the header's functions, the
// modelled instruction multiplies, the header's c_row/c_col read D back: D
// must be the plain product, bit for bit (the model and the loop below add
// the same fp32 products in the same order).
template <class S>
void expect_fragments_multiply_to_the_product() {
  constexpr int ld = 24;
  std::vector<uint16_t> a_tile = random_bits<S>(16 * ld, 1), b_tile = random_bits<S>(16 * ld, 2), bt_tile(8 * ld);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) bt_tile[n * ld + k] = b_tile[k * ld + n];
  uint32_t a[kLanes][4], b[kLanes][2], bt[kLanes][2];
  for (int lane = 0; lane < kLanes; ++lane) {
    mma::load_a(lane, a_tile.data(), ld, a[lane]);
    mma::load_b(lane, b_tile.data(), ld, b[lane]);
    mma::load_b_transposed(lane, bt_tile.data(), ld, bt[lane]);
  }
  for (auto* frag : {&b, &bt}) {
    float d[kLanes][4] = {};
    wm::mma<S>(d, a, *frag);
    for (int lane = 0; lane < kLanes; ++lane)
      for (int e = 0; e < 4; ++e) {
        const int m = mma::c_row(lane, e), n = mma::c_col(lane, e);
        float want = 0.f;
        for (int k = 0; k < 16; ++k)
          want += mma::widen_bits<S>(a_tile[m * ld + k]) * mma::widen_bits<S>(b_tile[k * ld + n]);
        EXPECT_EQ(d[lane][e], want) << "D[" << m << "][" << n << "], lane " << lane
                                    << (frag == &bt ? " (from Kᵀ)" : " (from V)");
      }
  }
}

TEST(MmaFragment, LoadedFragmentsMultiplyToThePlainProduct) {
  expect_fragments_multiply_to_the_product<bfloat16>();
  expect_fragments_multiply_to_the_product<float16>();
}

// P's two C fragments (columns 0..7, 8..15), rounded, are the A fragment of
// the 16 x 16 block P: what the hardware reads as A[row][col] is P[row][col].
TEST(MmaFragment, TwoResultFragmentsAreTheNextProductsOperand) {
  Generator g(3);
  std::vector<float> P = randn({16 * 16}, g).to_vector<float>();
  for (int lane = 0; lane < kLanes; ++lane) {
    float c0[4], c1[4];
    for (int e = 0; e < 4; ++e) {
      c0[e] = P[wm::ptx_c(lane, e).row * 16 + wm::ptx_c(lane, e).col];
      c1[e] = P[wm::ptx_c(lane, e).row * 16 + wm::ptx_c(lane, e).col + 8];
    }
    uint32_t a[4];
    mma::c_pair_to_a<bfloat16>(c0, c1, a);
    for (int i = 0; i < 8; ++i) {
      const wm::Pos p = wm::ptx_a(lane, i);
      EXPECT_EQ(wm::element(a, i), mma::round_bits<bfloat16>(P[p.row * 16 + p.col])) << "lane " << lane << " a" << i;
    }
  }
}

namespace {

// One head of the kernel, q, k, v [T][HD] raw 16-bit -> o [T][HD] (rounded to
// S, widened), lse [T]: its blocks, warps and K/V tiles in order, each step
// of flash_forward_mma_kernel run for the 32 lanes (warps are independent:
// they only read the shared tiles, so they run one after another here).
template <int HD, class S>
void simulate_kernel(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                     int T, float scale, std::vector<float>& o, std::vector<float>& lse) {
  constexpr int LD = HD + fm::kPad, KK = HD / mma::kK, NJ = HD / mma::kN;
  std::vector<uint16_t> q_tile(fm::kKeys * LD), k_tile(fm::kKeys * LD), v_tile(fm::kKeys * LD);
  auto load_tile = [&](std::vector<uint16_t>& tile, const std::vector<uint16_t>& x, int row0) {
    for (int r = 0; r < fm::kKeys; ++r)
      for (int c = 0; c < HD; ++c) tile[r * LD + c] = row0 + r < T ? x[(row0 + r) * HD + c] : uint16_t(0);
  };
  o.assign(size_t(T) * HD, 0.f);
  lse.assign(T, 0.f);
  std::vector<fm::RowState<HD>> st(kLanes);
  for (int r0 = 0; r0 < T; r0 += fm::kBlockRows) {
    load_tile(q_tile, q, r0);
    for (int warp = 0; warp < fm::kWarps; ++warp) {
      const int row0 = r0 + warp * fm::kWarpRows;
      uint32_t qa[KK][kLanes][4];
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int kk = 0; kk < KK; ++kk)
          mma::load_a(lane, q_tile.data() + warp * fm::kWarpRows * LD + kk * mma::kK, LD, qa[kk][lane]);
        fm::start_rows(st[lane]);
      }
      for (int key0 = 0; key0 < std::min(r0 + fm::kBlockRows, T); key0 += fm::kKeys) {
        load_tile(k_tile, k, key0);
        load_tile(v_tile, v, key0);
        float s[fm::kKeyTiles][kLanes][4] = {};
        for (int j = 0; j < fm::kKeyTiles; ++j)
          for (int kk = 0; kk < KK; ++kk) {
            uint32_t kb[kLanes][2];
            for (int lane = 0; lane < kLanes; ++lane)
              mma::load_b_transposed(lane, k_tile.data() + j * mma::kN * LD + kk * mma::kK, LD, kb[lane]);
            wm::mma<S>(s[j], qa[kk], kb);
          }
        float row_max[2][kLanes];
        float s_lane[kLanes][fm::kKeyTiles][4];
        for (int lane = 0; lane < kLanes; ++lane) {
          for (int j = 0; j < fm::kKeyTiles; ++j) std::copy_n(s[j][lane], 4, s_lane[lane][j]);
          float m[2];
          fm::scale_and_mask(lane, s_lane[lane], scale, key0, row0, T, m);
          row_max[0][lane] = m[0], row_max[1][lane] = m[1];
        }
        wm::group_max(row_max[0]);
        wm::group_max(row_max[1]);
        uint32_t pa[fm::kKeys / mma::kK][kLanes][4];
        for (int lane = 0; lane < kLanes; ++lane) {
          const float m[2] = {row_max[0][lane], row_max[1][lane]};
          uint32_t p[fm::kKeys / mma::kK][4];
          fm::softmax_tile<HD, S>(m, s_lane[lane], st[lane], p);
          for (int kk = 0; kk < fm::kKeys / mma::kK; ++kk) std::copy_n(p[kk], 4, pa[kk][lane]);
        }
        for (int kk = 0; kk < fm::kKeys / mma::kK; ++kk)
          for (int j = 0; j < NJ; ++j) {
            uint32_t vb[kLanes][2];
            float acc[kLanes][4];
            for (int lane = 0; lane < kLanes; ++lane) {
              mma::load_b(lane, v_tile.data() + kk * mma::kK * LD + j * mma::kN, LD, vb[lane]);
              std::copy_n(st[lane].o[j], 4, acc[lane]);
            }
            wm::mma<S>(acc, pa[kk], vb);
            for (int lane = 0; lane < kLanes; ++lane) std::copy_n(acc[lane], 4, st[lane].o[j]);
          }
      }
      float l[2][kLanes];
      for (int lane = 0; lane < kLanes; ++lane) l[0][lane] = st[lane].l[0], l[1][lane] = st[lane].l[1];
      wm::group_sum(l[0]);
      wm::group_sum(l[1]);
      for (int lane = 0; lane < kLanes; ++lane) {
        const float sum[2] = {l[0][lane], l[1][lane]};
        float L[2];
        fm::finish_rows(st[lane], sum, L);
        for (int r = 0; r < 2; ++r) {
          const int row = row0 + mma::c_row(lane, 2 * r);
          if (row >= T) continue;
          for (int j = 0; j < NJ; ++j)
            for (int e = 2 * r; e < 2 * r + 2; ++e)
              o[row * HD + j * mma::kN + mma::c_col(lane, e)] =
                  mma::widen_bits<S>(mma::round_bits<S>(st[lane].o[j][e]));
          if (lane % 4 == 0) lse[row] = L[r];
        }
      }
    }
  }
}

struct Errors {
  double o, lse;  // max |got - want| / max |want|, and max |got - want| of L
};

// The simulation against loom's CPU attention in fp32 over the same (16-bit)
// inputs: the composition (matmul, causal_softmax, matmul; P and O unrounded)
// for O, and each row's log-sum-exp of its scaled scores in double for L.
template <int HD, class S>
Errors simulate_against_cpu_attention(int T) {
  std::vector<uint16_t> q = random_bits<S>(size_t(T) * HD, 10 + T), k = random_bits<S>(size_t(T) * HD, 20 + T),
                        v = random_bits<S>(size_t(T) * HD, 30 + T);
  auto widened = [&](const std::vector<uint16_t>& x) {
    Tensor t = empty({T, HD}, kFloat32);
    for (size_t i = 0; i < x.size(); ++i) t.data<float>()[i] = mma::widen_bits<S>(x[i]);
    return t;
  };
  const float scale = 1.f / std::sqrt(float(HD));
  std::vector<float> o, lse;
  simulate_kernel<HD, S>(q, k, v, T, scale, o, lse);
  const Tensor qf = widened(q), kf = widened(k), vf = widened(v);
  const std::vector<float> want =
      ops::matmul(ops::causal_softmax(ops::matmul(qf, ops::transpose(kf, 0, 1)), scale), vf).to_vector<float>();
  double err = 0, top = 0, lse_err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, double(std::fabs(o[i] - want[i])));
    top = std::max(top, double(std::fabs(want[i])));
  }
  const float* qp = qf.data<float>();
  const float* kp = kf.data<float>();
  for (int i = 0; i < T; ++i) {
    double sum = 0;
    for (int j = 0; j <= i; ++j) {
      double dot = 0;
      for (int d = 0; d < HD; ++d) dot += double(qp[i * HD + d]) * kp[j * HD + d];
      sum += std::exp(scale * dot);
    }
    lse_err = std::max(lse_err, std::fabs(lse[i] - std::log(sum)));
  }
  return {err / top, lse_err};
}

}  // namespace

// T: one row, a part-block, one whole block, four blocks and a row (257).
// Tolerances, relative to O's largest element, in units of the 16-bit type's
// rounding (2^-8 bf16, 2^-11 fp16): O's own final rounding is up to half a
// unit, P's rounding before P V adds about as much again; measured worst 0.73
// units (bf16, HD 128, T 257) and 0.89 (fp16, HD 64, T 257): 1.5 units. L is
// fp32 arithmetic throughout: measured 5.6e-7 at most, 2e-6 allowed.
TEST(FlashAttentionMma, SimulatedWarpsMatchTheCpuAttention) {
  for (int T : {1, 17, 64, 257}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const double bf16 = 1.5 / 256, fp16 = 1.5 / 2048, lse = 2e-6;
    for (const Errors& e : {simulate_against_cpu_attention<64, bfloat16>(T),
                            simulate_against_cpu_attention<128, bfloat16>(T)}) {
      EXPECT_LE(e.o, bf16) << "bf16 o";
      EXPECT_LE(e.lse, lse) << "bf16 lse";
    }
    for (const Errors& e : {simulate_against_cpu_attention<64, float16>(T),
                            simulate_against_cpu_attention<128, float16>(T)}) {
      EXPECT_LE(e.o, fp16) << "fp16 o";
      EXPECT_LE(e.lse, lse) << "fp16 lse";
    }
  }
}
