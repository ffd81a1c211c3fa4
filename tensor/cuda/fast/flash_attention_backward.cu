// Flash attention's backward on the GPU (FlashAttention-2's, deterministic):
// dq, dk, dv from dO, q, k, v, o and the forward's log-sum-exp L, rebuilding
// each attention weight P_ij = exp(scale q_i·k_j - L_i) where it is needed
// instead of reading a saved [T, T] matrix (tensor/kernels/flash_attention.h
// has the formulas). Three kernels, none with atomics, so every sum runs in a
// fixed order and a rerun gives the same bits:
//   1. D_i = dO_i · o_i, one thread per row.
//   2. dK, dV: a block of kRows = 64 threads owns 64 keys (k_j, v_j in its
//      shared memory, padded to HD + 1 floats a row so the 32 threads of a
//      warp read 32 different banks; dk_j, dv_j in registers) and walks the
//      queries from its first key on (earlier ones cannot see these keys) in
//      tiles of kQueryTile = 16 rows of q and dO (broadcast reads).
//   3. dQ: a block owns 64 queries (q_i, dO_i, dq_i in registers) and walks
//      the keys up to its last query in tiles of kKeyTile = 32 rows of k, v.
// Splitting dK/dV from dQ is what removes the atomics: FlashAttention-2's
// single pass adds dq from every key block at once (atomicAdd, in an order
// that changes from run to run); here the recomputation of P twice costs
// about 3/7 more FMAs. Memory traffic stays O(T·hd) per row.
//
// Shared memory per block at HD = 64: dK/dV 2 · 64 · 65 + 2 · 16 · 64 + 32
// floats = 41.4 KiB; dQ 2 · 32 · 64 floats = 16 KiB.
#include "tensor/cuda/fast/flash_attention.h"
#include "tensor/cuda/fast/flash_tiles.cuh"
#include "tensor/ops.h"

namespace loom::cuda {
namespace {

using namespace flash;

// D [B·H·T] float: row r of dO and o, both [B, H, T, hd].
template <int HD, class S>
__global__ void flash_row_dot_kernel(Heads<const S> dO, Heads<const S> o, float* D, int H, int T, int hd,
                                     int64_t rows) {
  LOOM_GRID_STRIDE_LOOP(r, rows) {
    const int bh = int(r / T), t = int(r % T), b = bh / H, h = bh % H;
    float a[HD], c[HD];
    load_row<HD>(a, dO.row(b, h, t), true, hd);
    load_row<HD>(c, o.row(b, h, t), true, hd);
    D[r] = dot<HD, float>(a, c);
  }
}

// Grid: x = B·H heads, y = key blocks, the first (longest: every query after them) first.
template <int HD, class S>
__global__ void __launch_bounds__(kRows) flash_dkdv_kernel(Heads<const S> q, Heads<const S> k, Heads<const S> v,
                                                           Heads<const S> dO, Heads<S> dk_out, Heads<S> dv_out,
                                                           const float* lse, const float* D, int H, int T, int hd,
                                                           float scale) {
  constexpr int kPadded = HD + 1;  // row stride of the per-thread rows: bank (t + d) % 32 for thread t
  __shared__ float k_rows[kRows * kPadded], v_rows[kRows * kPadded];
  __shared__ float q_tile[kQueryTile * HD], do_tile[kQueryTile * HD], L_tile[kQueryTile], D_tile[kQueryTile];
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  const int k0 = blockIdx.y * kRows, j = k0 + threadIdx.x;  // this thread's key
  float* k_j = k_rows + threadIdx.x * kPadded;
  float* v_j = v_rows + threadIdx.x * kPadded;
  load_row<HD>(k_j, k.row(b, h, j), j < T, hd);
  load_row<HD>(v_j, v.row(b, h, j), j < T, hd);
  float dk[HD], dv[HD];
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) dk[d] = dv[d] = 0.f;
  const float* lse_bh = lse + int64_t(blockIdx.x) * T;
  const float* D_bh = D + int64_t(blockIdx.x) * T;
  for (int q0 = k0; q0 < T; q0 += kQueryTile) {  // queries before k0 cannot see these keys
    load_tile<kQueryTile, HD>(q_tile, q, b, h, q0, T, hd);
    load_tile<kQueryTile, HD>(do_tile, dO, b, h, q0, T, hd);
    if (threadIdx.x < kQueryTile) {
      L_tile[threadIdx.x] = q0 + threadIdx.x < T ? lse_bh[q0 + threadIdx.x] : 0.f;
      D_tile[threadIdx.x] = q0 + threadIdx.x < T ? D_bh[q0 + threadIdx.x] : 0.f;
    }
    __syncthreads();
    const int n = min(kQueryTile, T - q0);
    for (int i = 0; i < n; ++i)
      dkdv_step<HD>(SharedRow{q_tile + i * HD}, SharedRow{do_tile + i * HD}, L_tile[i], D_tile[i], q0 + i,
                    SharedRow{k_j}, SharedRow{v_j}, j, scale, dk, dv);
    __syncthreads();  // before the next tile overwrites this one
  }
  if (j < T) {
    store_row<HD>(dk_out.row(b, h, j), dk, hd, scale);
    store_row<HD>(dv_out.row(b, h, j), dv, hd, 1.f);
  }
}

// Grid: x = B·H heads, y = query blocks, the last (longest) first.
template <int HD, class S>
__global__ void __launch_bounds__(kRows) flash_dq_kernel(Heads<const S> q, Heads<const S> k, Heads<const S> v,
                                                         Heads<const S> dO, Heads<S> dq_out, const float* lse,
                                                         const float* D, int H, int T, int hd, float scale) {
  __shared__ float k_tile[kKeyTile * HD], v_tile[kKeyTile * HD];
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  const int r0 = (gridDim.y - 1 - blockIdx.y) * kRows, i = r0 + threadIdx.x;  // this thread's query
  float q_i[HD], do_i[HD], dq[HD];
  load_row<HD>(q_i, q.row(b, h, i), i < T, hd);
  load_row<HD>(do_i, dO.row(b, h, i), i < T, hd);
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) dq[d] = 0.f;
  const float L_i = i < T ? lse[int64_t(blockIdx.x) * T + i] : 0.f;
  const float D_i = i < T ? D[int64_t(blockIdx.x) * T + i] : 0.f;
  const int end = min(r0 + kRows, T);
  for (int key0 = 0; key0 < end; key0 += kKeyTile) {
    load_tile<kKeyTile, HD>(k_tile, k, b, h, key0, T, hd);
    load_tile<kKeyTile, HD>(v_tile, v, b, h, key0, T, hd);
    __syncthreads();
    const int n = min(kKeyTile, T - key0);
    for (int j = 0; j < n; ++j)
      dq_step<HD>(q_i, do_i, L_i, D_i, i, SharedRow{k_tile + j * HD}, SharedRow{v_tile + j * HD}, key0 + j, scale, dq);
    __syncthreads();
  }
  if (i < T) store_row<HD>(dq_out.row(b, h, i), dq, hd, scale);
}

}  // namespace

ops::FlashAttentionGrads flash_attention_backward(const Tensor& grad_o, const Tensor& q, const Tensor& k,
                                                  const Tensor& v, const Tensor& o, const Tensor& lse, double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  auto merged = [&] { return ops::transpose(empty({B, T, H, hd}, q.dtype(), q.device()), 1, 2); };
  ops::FlashAttentionGrads g{merged(), merged(), merged()};
  if (B * H * T == 0) return g;
  LOOM_CHECK((T + kRows - 1) / kRows <= 65535, "flash_attention_backward: T ", T, " needs more than 65535 blocks");
  Tensor D = empty({B, H, T}, kFloat32, q.device());
  DeviceGuard guard(q.device());
  const dim3 grid(unsigned(B * H), unsigned((T + kRows - 1) / kRows));
  const LaunchConfig rows = launch_config(B * H * T);
  cudaStream_t st = stream(q.device());
  dispatch(q.dtype(), hd, [&](auto s, auto padded) {
    using S = decltype(s);
    constexpr int HD = decltype(padded)::value;
    const Heads<const S> hq = heads_of<const S>(q), hk = heads_of<const S>(k), hv = heads_of<const S>(v);
    const Heads<const S> hdo = heads_of<const S>(grad_o), ho = heads_of<const S>(o);
    const float *L = ptr<float>(lse), *Dp = ptr<float>(D);
    flash_row_dot_kernel<HD, S><<<rows.blocks, rows.threads, 0, st>>>(hdo, ho, ptr<float>(D), int(H), int(T),
                                                                      int(hd), B * H * T);
    CUDA_CHECK_LAUNCH();
    flash_dkdv_kernel<HD, S><<<grid, kRows, 0, st>>>(hq, hk, hv, hdo, heads_of<S>(g.dk), heads_of<S>(g.dv), L, Dp,
                                                     int(H), int(T), int(hd), float(scale));
    CUDA_CHECK_LAUNCH();
    flash_dq_kernel<HD, S><<<grid, kRows, 0, st>>>(hq, hk, hv, hdo, heads_of<S>(g.dq), L, Dp, int(H), int(T),
                                                   int(hd), float(scale));
    CUDA_CHECK_LAUNCH();
  });
  return g;
}

}  // namespace loom::cuda
