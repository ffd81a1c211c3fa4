// Flash attention's backward on tensor cores: flash_attention_backward.cu's
// three kernels (D, then dK/dV per key block, then dQ per query block: no
// atomics, every sum in a fixed order, the same bits on every run) with the
// five products per block of scores, S = Q Kᵀ (twice: once per pass), dP =
// dO Vᵀ, dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K, on mma.sync.m16n8k16 (bf16 or
// fp16 operands, fp32 results) instead of fp32 FMAs on the CUDA cores.
// Chosen with the tensor-core forward (flash_attention_mma.cu) under
// LOOM_CUDA_KERNELS=fast for bf16/fp16, head size 64 or 128.
//
// What it does that the reference does not: a warp owns 16 keys (dK/dV) or
// 16 queries (dQ) and takes the other side 16 rows at a time, each product
// an instruction over a 16 x 16 block (tensor/kernels/flash_attention_mma_backward.h
// has the per-lane steps and why the dK/dV pass computes Sᵀ = K Qᵀ: Pᵀ and
// dSᵀ then become the next products' operands in registers). dQ stays a
// separate pass, as in the reference, instead of FlashAttention-2's
// atomicAdd of every key block's share: the price is S and dP computed twice
// (7 products where 5 would do), the gain a rerun that repeats to the bit.
// Why faster: the tensor cores' ~15x the CUDA cores' fp32 rate (see
// flash_attention_mma.cu), operands kept 16-bit in shared memory (half the
// bytes), and rows in a warp's registers instead of one thread's (the
// reference stops at head size 64; here 128 fits).
//
// Numerically: S, dP and the three gradient products are exact products of
// 16-bit inputs summed in fp32 (as the reference, in another order); P and
// dS are rounded to bf16/fp16 before they multiply (the reference keeps them
// fp32): each gradient differs by about one rounding of its operand, ~2^-9
// relative for bf16, 2^-12 for fp16, on top of its own final rounding (the
// CPU simulation: 1.72 units of the 16-bit type at most, against the CPU's
// attention and the reference kernels). D is the reference's arithmetic.
// tests/cuda/test_cuda_flash_attention_mma_backward.cpp states the tolerances.
//
// Not yet run on a GPU (no device was lent when it was written): its indexing
// and per-lane math are tested on the CPU (tests/test_flash_attention_mma_backward.cpp),
// its loads, stores and the instruction itself only by the GPU test.
//
// Grids: x = B·H heads, y = blocks of 64 keys (dK/dV: the first, which every
// query after it sees, first) or 64 queries (dQ: the last first). Blocks: 4
// warps. Shared, 16-bit rows of HD + 8: dK/dV K, V [64] and Q, dO
// [kQueryRows] (36.5 KiB at HD 64, 42.6 KiB at HD 128); dQ K, V [64] (18, 34 KiB).
#include "tensor/cuda/fast/flash_attention_mma.h"
#include "tensor/cuda/fast/mma_tiles.cuh"
#include "tensor/kernels/flash_attention_mma_backward.h"
#include "tensor/ops.h"

namespace loom::cuda {
namespace {

using namespace flash;
using namespace loom::kernels::flash_mma;
namespace mma = loom::kernels::mma;

// D [B·H·T] float: D_r = dO_r · o_r, one thread per row.
template <int HD, class S>
__global__ void flash_row_dot_mma_kernel(Heads<const S> dO, Heads<const S> o, float* D, int H, int T, int64_t rows) {
  LOOM_GRID_STRIDE_LOOP(r, rows) {
    const int bh = int(r / T), t = int(r % T), b = bh / H, h = bh % H;
    D[r] = row_dot_bits<HD, S>(reinterpret_cast<const uint16_t*>(dO.row(b, h, t)),
                               reinterpret_cast<const uint16_t*>(o.row(b, h, t)));
  }
}

// The warp's 16 rows (row0..) of a [16 x HD] fp32 result, C fragments acc
// [HD/8][4], times `factor`, rounded to S, into dst's rows before T.
template <int HD, class S>
__device__ __forceinline__ void store_rows(const Heads<S>& dst, int b, int h, int row0, int T, int lane,
                                           const float (&acc)[HD / mma::kN][4], float factor) {
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) {  // rows g and g + 8
    const int row = row0 + mma::c_row(lane, 2 * r);
    if (row >= T) continue;
    uint16_t* out = reinterpret_cast<uint16_t*>(dst.row(b, h, row));
    LOOM_UNROLL
    for (int j = 0; j < HD / mma::kN; ++j)
      *reinterpret_cast<uint32_t*>(out + j * mma::kN + mma::c_col(lane, 2 * r)) =
          mma::pack_rounded<S>(acc[j][2 * r] * factor, acc[j][2 * r + 1] * factor);
  }
}

// dK, dV for 64 keys (warp w: keys k0 + 16w..), over the queries from k0 on
// (earlier ones cannot see these keys) in tiles of kQueryRows<HD> rows.
template <int HD, class S>
__global__ void __launch_bounds__(kWarps * 32) flash_dkdv_mma_kernel(Heads<const S> q, Heads<const S> k,
                                                                     Heads<const S> v, Heads<const S> dO,
                                                                     Heads<S> dk_out, Heads<S> dv_out,
                                                                     const float* lse, const float* D, int H, int T,
                                                                     float scale) {
  constexpr int LD = HD + kPad, QT = kQueryRows<HD>, NJ = HD / mma::kN, KK = HD / mma::kK;
  __shared__ alignas(16) uint16_t k_tile[kBlockRows * LD], v_tile[kBlockRows * LD], q_tile[QT * LD],
      do_tile[QT * LD];
  __shared__ float L_tile[QT], D_tile[QT];
  const int b = blockIdx.x / H, h = blockIdx.x % H, k0 = blockIdx.y * kBlockRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, key_row0 = k0 + warp * kWarpRows;  // this warp's keys
  const uint16_t* k_rows = k_tile + warp * kWarpRows * LD;
  const uint16_t* v_rows = v_tile + warp * kWarpRows * LD;
  load_tile_bits<kBlockRows, HD, LD>(k_tile, k, b, h, k0, T);
  load_tile_bits<kBlockRows, HD, LD>(v_tile, v, b, h, k0, T);
  float dk[NJ][4] = {}, dv[NJ][4] = {};  // [16 keys x HD] each, C fragments
  const float* lse_bh = lse + int64_t(blockIdx.x) * T;
  const float* D_bh = D + int64_t(blockIdx.x) * T;
  for (int q0 = k0; q0 < T; q0 += QT) {
    load_tile_bits<QT, HD, LD>(q_tile, q, b, h, q0, T);
    load_tile_bits<QT, HD, LD>(do_tile, dO, b, h, q0, T);
    for (int i = threadIdx.x; i < QT; i += blockDim.x) {
      L_tile[i] = q0 + i < T ? lse_bh[q0 + i] : 0.f;
      D_tile[i] = q0 + i < T ? D_bh[q0 + i] : 0.f;
    }
    __syncthreads();
    for (int c = 0; c < QT; c += kChunk) {  // queries q0 + c.. (the same for the whole warp)
      if (q0 + c >= T) break;
      if (q0 + c + kChunk - 1 < key_row0 || key_row0 >= T) continue;  // all 16 before its first key, or no keys
      float s[2][4] = {}, dp[2][4] = {};  // Sᵀ, dPᵀ [16 keys x 16 queries]
      LOOM_UNROLL
      for (int kk = 0; kk < KK; ++kk) {
        uint32_t ka[4], va[4];
        mma::load_a(lane, k_rows + kk * mma::kK, LD, ka);
        mma::load_a(lane, v_rows + kk * mma::kK, LD, va);
        LOOM_UNROLL
        for (int j = 0; j < 2; ++j) {
          uint32_t qb[2], dob[2];
          mma::load_b_transposed(lane, q_tile + (c + mma::kN * j) * LD + kk * mma::kK, LD, qb);
          mma::load_b_transposed(lane, do_tile + (c + mma::kN * j) * LD + kk * mma::kK, LD, dob);
          mma_m16n8k16<S>(s[j], ka, qb);
          mma_m16n8k16<S>(dp[j], va, dob);
        }
      }
      key_rows_grads(lane, s, dp, scale, key_row0, q0 + c, T, L_tile + c, D_tile + c);
      uint32_t pa[4], dsa[4];  // Pᵀ, dSᵀ as A fragments
      mma::c_pair_to_a<S>(s[0], s[1], pa);
      mma::c_pair_to_a<S>(dp[0], dp[1], dsa);
      LOOM_UNROLL
      for (int j = 0; j < NJ; ++j) {  // columns 8j.. of dV += Pᵀ dO, dK += dSᵀ Q
        uint32_t dob[2], qb[2];
        mma::load_b(lane, do_tile + c * LD + j * mma::kN, LD, dob);
        mma::load_b(lane, q_tile + c * LD + j * mma::kN, LD, qb);
        mma_m16n8k16<S>(dv[j], pa, dob);
        mma_m16n8k16<S>(dk[j], dsa, qb);
      }
    }
    __syncthreads();  // before the next tile overwrites this one
  }
  store_rows<HD>(dk_out, b, h, key_row0, T, lane, dk, scale);
  store_rows<HD>(dv_out, b, h, key_row0, T, lane, dv, 1.f);
}

// dQ for 64 queries (warp w: queries r0 + 16w..), over the keys up to the
// block's last query in tiles of 64.
template <int HD, class S>
__global__ void __launch_bounds__(kWarps * 32) flash_dq_mma_kernel(Heads<const S> q, Heads<const S> k,
                                                                   Heads<const S> v, Heads<const S> dO,
                                                                   Heads<S> dq_out, const float* lse, const float* D,
                                                                   int H, int T, float scale) {
  constexpr int LD = HD + kPad, NJ = HD / mma::kN, KK = HD / mma::kK;
  __shared__ alignas(16) uint16_t k_tile[kKeys * LD], v_tile[kKeys * LD];
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  const int r0 = (gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = r0 + warp * kWarpRows;  // this warp's queries

  // Q and dO [16 x HD] as A fragments, through shared memory (K's and V's, before the first tiles).
  load_tile_bits<kBlockRows, HD, LD>(k_tile, q, b, h, r0, T);
  load_tile_bits<kBlockRows, HD, LD>(v_tile, dO, b, h, r0, T);
  __syncthreads();
  uint32_t qa[KK][4], doa[KK][4];
  LOOM_UNROLL
  for (int kk = 0; kk < KK; ++kk) {
    mma::load_a(lane, k_tile + warp * kWarpRows * LD + kk * mma::kK, LD, qa[kk]);
    mma::load_a(lane, v_tile + warp * kWarpRows * LD + kk * mma::kK, LD, doa[kk]);
  }
  __syncthreads();
  float L[2], Di[2];  // rows g and g + 8
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + mma::c_row(lane, 2 * r);
    L[r] = row < T ? lse[int64_t(blockIdx.x) * T + row] : 0.f;
    Di[r] = row < T ? D[int64_t(blockIdx.x) * T + row] : 0.f;
  }
  float dq[NJ][4] = {};  // [16 queries x HD], C fragments
  const int end = min(r0 + kBlockRows, T);  // keys past the block's last query are never needed
  for (int key0 = 0; key0 < end; key0 += kKeys) {
    load_tile_bits<kKeys, HD, LD>(k_tile, k, b, h, key0, T);
    load_tile_bits<kKeys, HD, LD>(v_tile, v, b, h, key0, T);
    __syncthreads();
    for (int c = 0; c < kKeys; c += kChunk) {  // keys key0 + c..
      if (key0 + c >= T || key0 + c > row0 + kWarpRows - 1) break;  // past T, or after all 16 queries
      float s[2][4] = {}, dp[2][4] = {};  // S, dP [16 queries x 16 keys]
      LOOM_UNROLL
      for (int kk = 0; kk < KK; ++kk)
        LOOM_UNROLL
        for (int j = 0; j < 2; ++j) {
          uint32_t kb[2], vb[2];
          mma::load_b_transposed(lane, k_tile + (c + mma::kN * j) * LD + kk * mma::kK, LD, kb);
          mma::load_b_transposed(lane, v_tile + (c + mma::kN * j) * LD + kk * mma::kK, LD, vb);
          mma_m16n8k16<S>(s[j], qa[kk], kb);
          mma_m16n8k16<S>(dp[j], doa[kk], vb);
        }
      query_rows_grads(lane, s, dp, scale, row0, key0 + c, T, L, Di);
      uint32_t dsa[4];  // dS as an A fragment
      mma::c_pair_to_a<S>(dp[0], dp[1], dsa);
      LOOM_UNROLL
      for (int j = 0; j < NJ; ++j) {  // columns 8j.. of dQ += dS K
        uint32_t kb[2];
        mma::load_b(lane, k_tile + c * LD + j * mma::kN, LD, kb);
        mma_m16n8k16<S>(dq[j], dsa, kb);
      }
    }
    __syncthreads();  // before the next tile overwrites this one
  }
  store_rows<HD>(dq_out, b, h, row0, T, lane, dq, scale);
}

}  // namespace

ops::FlashAttentionGrads flash_attention_mma_backward(const Tensor& grad_o, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& o, const Tensor& lse,
                                                      double scale) {
  const std::string why = flash_attention_mma_unsupported(q, k, v);
  LOOM_CHECK(why.empty(), "flash_attention_mma_backward: ", why);
  // dO and o as 16-byte rows too (a gradient may arrive as any view).
  const Tensor dO = rows_aligned16(grad_o) ? grad_o : ops::contiguous(grad_o);
  const Tensor out = rows_aligned16(o) ? o : ops::contiguous(o);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  auto merged = [&] { return ops::transpose(empty({B, T, H, hd}, q.dtype(), q.device()), 1, 2); };
  ops::FlashAttentionGrads g{merged(), merged(), merged()};
  if (B * H * T == 0) return g;
  Tensor D = empty({B, H, T}, kFloat32, q.device());
  DeviceGuard guard(q.device());
  const dim3 grid(unsigned(B * H), unsigned((T + kBlockRows - 1) / kBlockRows));
  const LaunchConfig rows = launch_config(B * H * T);
  cudaStream_t st = stream(q.device());
  auto launch = [&](auto s, auto head) {
    using S = decltype(s);
    constexpr int HD = decltype(head)::value;
    const Heads<const S> hq = heads_of<const S>(q), hk = heads_of<const S>(k), hv = heads_of<const S>(v);
    const Heads<const S> hdo = heads_of<const S>(dO);
    const float *L = ptr<float>(lse), *Dp = ptr<float>(D);
    flash_row_dot_mma_kernel<HD, S><<<rows.blocks, rows.threads, 0, st>>>(hdo, heads_of<const S>(out), ptr<float>(D),
                                                                          int(H), int(T), B * H * T);
    CUDA_CHECK_LAUNCH();
    flash_dkdv_mma_kernel<HD, S><<<grid, kWarps * 32, 0, st>>>(hq, hk, hv, hdo, heads_of<S>(g.dk),
                                                               heads_of<S>(g.dv), L, Dp, int(H), int(T), float(scale));
    CUDA_CHECK_LAUNCH();
    flash_dq_mma_kernel<HD, S><<<grid, kWarps * 32, 0, st>>>(hq, hk, hv, hdo, heads_of<S>(g.dq), L, Dp, int(H),
                                                             int(T), float(scale));
    CUDA_CHECK_LAUNCH();
  };
  auto by_hd = [&](auto s) {
    if (hd == 64) launch(s, std::integral_constant<int, 64>{});
    else launch(s, std::integral_constant<int, 128>{});
  };
  if (q.dtype() == kBFloat16) by_hd(bfloat16{});
  else by_hd(float16{});
  return g;
}

}  // namespace loom::cuda
