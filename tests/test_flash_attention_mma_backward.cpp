// The tensor-core flash attention backward (tensor/cuda/fast/flash_attention_mma_backward.cu)
// on the CPU: its three kernels' loops, each step run for 32 simulated lanes
// through the fragment functions (tensor/kernels/mma_fragment.h) and the
// per-lane math (tensor/kernels/flash_attention_mma_backward.h), with the
// model of the mma instruction (mma_warp_model.h) in between; against loom's
// CPU attention backward (autograd through the composition, in float64, and
// at head size 64 the CPU run of the reference kernels, ops::flash_attention_backward).
// No GPU: this is what checks the kernels' indexing here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "error_of.h"
#include "mma_warp_model.h"
#include "tensor/flash_attention.h"
#include "tensor/generator.h"
#include "tensor/kernels/flash_attention_mma_backward.h"
#include "tensor/ops.h"

using namespace loom;
namespace mma = loom::kernels::mma;
namespace fm = loom::kernels::flash_mma;
namespace wm = loom::test::warp_model;
constexpr int kLanes = wm::kLanes;

namespace {

using Bits = std::vector<uint16_t>;  // [T][HD] raw 16-bit values of one head
using Frags = float[kLanes][4];      // one C fragment of a warp

// One head's backward inputs: q, k, v, dO random; o and lse the forward's.
struct Head { Bits q, k, v, dO, o; std::vector<float> lse; };

// A warp's 32 lanes of a C fragment pair (16 columns) -> one lane's [2][4].
void lane_out(const Frags (&x)[2], int lane, float (&y)[2][4]) {
  for (int j = 0; j < 2; ++j) std::copy_n(x[j][lane], 4, y[j]);
}

// acc [NJ][32][4]: the warp's 16 rows (row0..) of a [16 x HD] result, times
// factor, rounded to S as the kernel stores them, into out [T][HD] (widened).
template <int HD, class S>
void store_rows(const Frags* acc, int row0, int T, float factor, std::vector<float>& out) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + mma::c_row(lane, e);
      if (row >= T) continue;
      for (int j = 0; j < HD / mma::kN; ++j)
        out[row * HD + j * mma::kN + mma::c_col(lane, e)] =
            mma::widen_bits<S>(mma::round_bits<S>(acc[j][lane][e] * factor));
    }
}

// The three kernels of one head, in their order: D, then dK/dV per block of
// 64 keys, then dQ per block of 64 queries; a block's warps one after another
// (they only share read-only tiles).
template <int HD, class S>
void simulate_backward(const Head& x, int T, float scale, std::vector<float>& dq, std::vector<float>& dk,
                       std::vector<float>& dv) {
  constexpr int LD = HD + fm::kPad, KK = HD / mma::kK, NJ = HD / mma::kN, QT = fm::kQueryRows<HD>;
  auto load_tile = [&](Bits& tile, const Bits& src, int row0, int rows) {
    tile.assign(size_t(rows) * LD, 0);
    for (int r = 0; r < rows && row0 + r < T; ++r) std::copy_n(&src[(row0 + r) * HD], HD, &tile[r * LD]);
  };
  std::vector<float> D(T);
  for (int t = 0; t < T; ++t) D[t] = fm::row_dot_bits<HD, S>(&x.dO[t * HD], &x.o[t * HD]);
  dq.assign(size_t(T) * HD, 0.f), dk.assign(size_t(T) * HD, 0.f), dv.assign(size_t(T) * HD, 0.f);
  Bits k_tile, v_tile, q_tile, do_tile;
  for (int k0 = 0; k0 < T; k0 += fm::kBlockRows) {  // dK/dV
    load_tile(k_tile, x.k, k0, fm::kBlockRows);
    load_tile(v_tile, x.v, k0, fm::kBlockRows);
    for (int warp = 0; warp < fm::kWarps; ++warp) {
      const int key_row0 = k0 + warp * fm::kWarpRows;
      Frags dk_acc[NJ] = {}, dv_acc[NJ] = {};
      for (int q0 = k0; q0 < T; q0 += QT) {
        load_tile(q_tile, x.q, q0, QT);
        load_tile(do_tile, x.dO, q0, QT);
        float L_tile[QT], D_tile[QT];
        for (int i = 0; i < QT; ++i)
          L_tile[i] = q0 + i < T ? x.lse[q0 + i] : 0.f, D_tile[i] = q0 + i < T ? D[q0 + i] : 0.f;
        for (int c = 0; c < QT; c += fm::kChunk) {
          if (q0 + c >= T) break;
          if (q0 + c + fm::kChunk - 1 < key_row0 || key_row0 >= T) continue;
          Frags s[2] = {}, dp[2] = {};
          for (int kk = 0; kk < KK; ++kk) {
            uint32_t ka[kLanes][4], va[kLanes][4];
            for (int lane = 0; lane < kLanes; ++lane) {
              mma::load_a(lane, &k_tile[warp * fm::kWarpRows * LD + kk * mma::kK], LD, ka[lane]);
              mma::load_a(lane, &v_tile[warp * fm::kWarpRows * LD + kk * mma::kK], LD, va[lane]);
            }
            for (int j = 0; j < 2; ++j) {
              uint32_t qb[kLanes][2], dob[kLanes][2];
              for (int lane = 0; lane < kLanes; ++lane) {
                mma::load_b_transposed(lane, &q_tile[(c + mma::kN * j) * LD + kk * mma::kK], LD, qb[lane]);
                mma::load_b_transposed(lane, &do_tile[(c + mma::kN * j) * LD + kk * mma::kK], LD, dob[lane]);
              }
              wm::mma<S>(s[j], ka, qb);
              wm::mma<S>(dp[j], va, dob);
            }
          }
          uint32_t pa[kLanes][4], dsa[kLanes][4];
          for (int lane = 0; lane < kLanes; ++lane) {
            float sl[2][4], dpl[2][4];
            lane_out(s, lane, sl);
            lane_out(dp, lane, dpl);
            fm::key_rows_grads(lane, sl, dpl, scale, key_row0, q0 + c, T, L_tile + c, D_tile + c);
            mma::c_pair_to_a<S>(sl[0], sl[1], pa[lane]);
            mma::c_pair_to_a<S>(dpl[0], dpl[1], dsa[lane]);
          }
          for (int j = 0; j < NJ; ++j) {
            uint32_t dob[kLanes][2], qb[kLanes][2];
            for (int lane = 0; lane < kLanes; ++lane) {
              mma::load_b(lane, &do_tile[c * LD + j * mma::kN], LD, dob[lane]);
              mma::load_b(lane, &q_tile[c * LD + j * mma::kN], LD, qb[lane]);
            }
            wm::mma<S>(dv_acc[j], pa, dob);
            wm::mma<S>(dk_acc[j], dsa, qb);
          }
        }
      }
      store_rows<HD, S>(dk_acc, key_row0, T, scale, dk);
      store_rows<HD, S>(dv_acc, key_row0, T, 1.f, dv);
    }
  }
  for (int r0 = 0; r0 < T; r0 += fm::kBlockRows) {  // dQ
    load_tile(q_tile, x.q, r0, fm::kBlockRows);
    load_tile(do_tile, x.dO, r0, fm::kBlockRows);
    for (int warp = 0; warp < fm::kWarps; ++warp) {
      const int row0 = r0 + warp * fm::kWarpRows;
      uint32_t qa[KK][kLanes][4], doa[KK][kLanes][4];
      float L[kLanes][2], Di[kLanes][2];
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int kk = 0; kk < KK; ++kk) {
          mma::load_a(lane, &q_tile[warp * fm::kWarpRows * LD + kk * mma::kK], LD, qa[kk][lane]);
          mma::load_a(lane, &do_tile[warp * fm::kWarpRows * LD + kk * mma::kK], LD, doa[kk][lane]);
        }
        for (int r = 0; r < 2; ++r) {
          const int row = row0 + mma::c_row(lane, 2 * r);
          L[lane][r] = row < T ? x.lse[row] : 0.f, Di[lane][r] = row < T ? D[row] : 0.f;
        }
      }
      Frags dq_acc[NJ] = {};
      for (int key0 = 0; key0 < std::min(r0 + fm::kBlockRows, T); key0 += fm::kKeys) {
        load_tile(k_tile, x.k, key0, fm::kKeys);
        load_tile(v_tile, x.v, key0, fm::kKeys);
        for (int c = 0; c < fm::kKeys; c += fm::kChunk) {
          if (key0 + c >= T || key0 + c > row0 + fm::kWarpRows - 1) break;
          Frags s[2] = {}, dp[2] = {};
          for (int kk = 0; kk < KK; ++kk)
            for (int j = 0; j < 2; ++j) {
              uint32_t kb[kLanes][2], vb[kLanes][2];
              for (int lane = 0; lane < kLanes; ++lane) {
                mma::load_b_transposed(lane, &k_tile[(c + mma::kN * j) * LD + kk * mma::kK], LD, kb[lane]);
                mma::load_b_transposed(lane, &v_tile[(c + mma::kN * j) * LD + kk * mma::kK], LD, vb[lane]);
              }
              wm::mma<S>(s[j], qa[kk], kb);
              wm::mma<S>(dp[j], doa[kk], vb);
            }
          uint32_t dsa[kLanes][4];
          for (int lane = 0; lane < kLanes; ++lane) {
            float sl[2][4], dpl[2][4];
            lane_out(s, lane, sl);
            lane_out(dp, lane, dpl);
            fm::query_rows_grads(lane, sl, dpl, scale, row0, key0 + c, T, L[lane], Di[lane]);
            mma::c_pair_to_a<S>(dpl[0], dpl[1], dsa[lane]);
          }
          for (int j = 0; j < NJ; ++j) {
            uint32_t kb[kLanes][2];
            for (int lane = 0; lane < kLanes; ++lane) mma::load_b(lane, &k_tile[c * LD + j * mma::kN], LD, kb[lane]);
            wm::mma<S>(dq_acc[j], dsa, kb);
          }
        }
      }
      store_rows<HD, S>(dq_acc, row0, T, scale, dq);
    }
  }
}

// [T][HD] raw bits of S <-> a [1, 1, T, HD] tensor of dtype dt.
Tensor tensor_of(const Bits& x, int T, int HD, DType dt) {
  Tensor t = empty({1, 1, T, HD}, dt);
  std::memcpy(t.raw_data(), x.data(), x.size() * 2);
  return t;
}
template <class S>
Bits bits_of(const Tensor& t) {  // any floating dtype, rounded to S
  std::vector<float> f = ops::to(ops::contiguous(t), kFloat32).to_vector<float>();
  Bits b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = mma::round_bits<S>(f[i]);
  return b;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : ops::to(t, kFloat64).to_vector<double>()) m = std::max(m, std::fabs(x));
  return m;
}
// max |got - want| / max(max |want|, floor): relative to want's largest element.
double error_against(const Tensor& got, const Tensor& want, double floor = 0.0) {
  return max_abs(ops::sub(ops::to(got, kFloat64), ops::to(want, kFloat64))) / std::max(max_abs(want), floor);
}

struct Errors { double dq, dk, dv; };  // error_against of each

// q, k, v, dO random in S; loom's CPU attention in float64 over them (autograd
// through the composition) gives o (rounded to S, as the forward stores it),
// lse, and the gradients the simulation is held to. At HD 64 `ref_flash`
// receives the CPU run of the reference kernels' backward over the same inputs.
template <int HD, class S>
Errors simulate_against_cpu_attention(int T, Errors* ref_flash = nullptr) {
  const DType dt = std::is_same_v<S, bfloat16> ? kBFloat16 : kFloat16;
  Generator g(40 + T + HD);
  Head x;
  for (Bits* b : {&x.q, &x.k, &x.v, &x.dO}) *b = bits_of<S>(randn({T, HD}, g));
  const double scale = 1.0 / std::sqrt(double(HD));
  auto leaf = [&](const Bits& b) { return autograd::set_requires_grad(ops::to(tensor_of(b, T, HD, dt), kFloat64)); };
  const Tensor q = leaf(x.q), k = leaf(x.k), v = leaf(x.v), dO = ops::to(tensor_of(x.dO, T, HD, dt), kFloat64);
  const Tensor scores = autograd::matmul(q, autograd::transpose(k, -2, -1));
  const Tensor o = autograd::matmul(autograd::causal_softmax(scores, scale), v);
  autograd::backward({o}, {dO});
  x.o = bits_of<S>(o);
  const std::vector<double> s = scores.to_vector<double>();
  for (int i = 0; i < T; ++i) {
    const double m = scale * *std::max_element(&s[i * T], &s[i * T] + i + 1);
    double sum = 0;
    for (int j = 0; j <= i; ++j) sum += std::exp(scale * s[i * T + j] - m);
    x.lse.push_back(float(m + std::log(sum)));
  }
  std::vector<float> dq, dk, dv;
  simulate_backward<HD, S>(x, T, float(scale), dq, dk, dv);
  auto as_tensor = [&](const std::vector<float>& y) { return from_vector(y, {1, 1, T, HD}); };
  const Tensor gq = as_tensor(dq), gk = as_tensor(dk), gv = as_tensor(dv);
  if (ref_flash) {
    const Tensor lse = from_vector(x.lse, {1, 1, T});
    const ops::FlashAttentionGrads r =
        ops::flash_attention_backward(tensor_of(x.dO, T, HD, dt), tensor_of(x.q, T, HD, dt), tensor_of(x.k, T, HD, dt),
                                      tensor_of(x.v, T, HD, dt), tensor_of(x.o, T, HD, dt), lse, scale);
    const double floor = T == 1 ? max_abs(r.dv) : 0.0;
    *ref_flash = {error_against(gq, r.dq, floor), error_against(gk, r.dk, floor), error_against(gv, r.dv)};
  }
  // At T 1 dq and dk vanish (one key: P = 1 whatever its score), so their
  // error is measured against dv's largest element, the gradients' scale.
  const Tensor want_dv = autograd::grad(v);
  const double floor = T == 1 ? max_abs(want_dv) : 0.0;
  return {error_against(gq, autograd::grad(q), floor), error_against(gk, autograd::grad(k), floor),
          error_against(gv, want_dv)};
}

}  // namespace

// T: one row, a part-block, one whole block, a ragged 100 (at HD 128 the
// query tile is 16 rows: its last tile part-filled) and four blocks and a row.
// Tolerances relative to each gradient's largest element, in units of the
// 16-bit type's rounding (2^-8 bf16, 2^-11 fp16): the gradient's own final
// rounding (half a unit), P or dS rounded before its product (about as much
// again), o's rounding reaching dS through D. Measured worst 1.71 units
// against the composition (fp16 dk, HD 64, T 17; 1.30 at HD 128) and 1.72
// against the reference kernels (bf16 dq, HD 64, T 17; they round the
// gradients too, not P or dS): 2.5 units allowed.
TEST(FlashAttentionMmaBackward, SimulatedWarpsMatchTheCpuAttentionBackward) {
  for (int T : {1, 17, 64, 100, 257}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const double bf16 = 2.5 / 256, fp16 = 2.5 / 2048;
    Errors flash64{};
    for (const Errors& e : {simulate_against_cpu_attention<64, bfloat16>(T, &flash64),
                            simulate_against_cpu_attention<128, bfloat16>(T)}) {
      EXPECT_LE(e.dq, bf16) << "bf16 dq";
      EXPECT_LE(e.dk, bf16) << "bf16 dk";
      EXPECT_LE(e.dv, bf16) << "bf16 dv";
    }
    EXPECT_LE(std::max({flash64.dq, flash64.dk, flash64.dv}), bf16) << "bf16 vs the reference kernels on the CPU";
    for (const Errors& e : {simulate_against_cpu_attention<64, float16>(T, &flash64),
                            simulate_against_cpu_attention<128, float16>(T)}) {
      EXPECT_LE(e.dq, fp16) << "fp16 dq";
      EXPECT_LE(e.dk, fp16) << "fp16 dk";
      EXPECT_LE(e.dv, fp16) << "fp16 dv";
    }
    EXPECT_LE(std::max({flash64.dq, flash64.dk, flash64.dv}), fp16) << "fp16 vs the reference kernels on the CPU";
  }
}

// Head size 128 is the tensor-core kernels' alone: on the CPU flash attention
// refuses it (nn::attend then runs the composition), and the message says where it runs.
TEST(FlashAttentionMmaBackward, HeadSize128IsRefusedOffTheTensorCores) {
  Generator g(5);
  const Tensor q = randn({1, 2, 8, 128}, g, kBFloat16);
  const std::string why = ops::flash_attention_unsupported(q, q, q);
  EXPECT_NE(why.find("head size 128 (1 to 64"), std::string::npos) << why;
  EXPECT_NE(why.find("128 on the tensor cores: bf16/fp16 on a GPU with LOOM_CUDA_KERNELS=fast"), std::string::npos)
      << why;
  EXPECT_NE(test::error_of([&] { ops::flash_attention(q, q, q, 0.125); }).find("flash_attention: head size 128"),
            std::string::npos);
}
