// Flash attention's forward on tensor cores: flash_attention.cu's algorithm
// (FlashAttention-2's loop, the online softmax) with its two products, S = Q Kᵀ
// and O += P V, on mma.sync.m16n8k16 (bf16 or fp16 operands, fp32 results)
// instead of fp32 FMAs on the CUDA cores. Chosen under LOOM_CUDA_KERNELS=fast
// for bf16/fp16, head size 64 or 128 (flash_attention_mma.h).
//
// What it does that the reference does not: a warp, not a thread, owns query
// rows (16 of them); each product is an instruction over a 16 x 8 x 16 block,
// the warp's 32 lanes each holding a share (tensor/kernels/mma_fragment.h
// says which); P goes from the first product's result fragments straight
// into the second's operand fragments, never through memory. Why faster: an H100's
// or H200's tensor cores do ~990 dense bf16 TFLOP/s against ~67 fp32 TFLOP/s
// on its CUDA cores (~15x); the reference also keeps its operands as fp32 in
// shared memory, this one as 16-bit (half the bytes per tile).
//
// Numerically: S is exact products of the 16-bit inputs summed in fp32 (as
// the reference, in another order); P is rounded to bf16/fp16 before P V (the
// reference keeps it fp32): O differs by about one rounding of P, ~2^-9
// relative for bf16, 2^-12 for fp16, on top of O's own final rounding; l and
// L = m + log l are the reference's fp32 arithmetic. tests/cuda/
// test_cuda_flash_attention_mma.cpp states the tolerances.
//
// Not yet run on a GPU (no device was lent when it was written): its indexing
// and per-lane math are tested on the CPU (tests/test_flash_attention_mma.cpp),
// its loads, stores and the instruction itself only by the GPU test.
//
// Grid: x = B·H heads, y = blocks of 64 query rows, the last (longest) first.
// Block: 4 warps, 16 rows each. Shared: K and V tiles [64][HD + 8] 16-bit:
// 18 KiB at HD 64, 34 KiB at HD 128.
#include "tensor/cuda/fast/flash_attention_mma.h"
#include "tensor/cuda/fast/mma_tiles.cuh"
#include "tensor/kernels/flash_attention_mma.h"
#include "tensor/ops.h"

namespace loom::cuda {
namespace {

using namespace flash;
using namespace loom::kernels::flash_mma;
namespace mma = loom::kernels::mma;

// Over the 4 lanes of a row (lanes 4g..4g+3): every lane ends with the same bits.
__device__ __forceinline__ float group_max(float x) {
  float y = __shfl_xor_sync(0xffffffffu, x, 1);
  x = y > x ? y : x;
  y = __shfl_xor_sync(0xffffffffu, x, 2);
  return y > x ? y : x;
}
__device__ __forceinline__ float group_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// q, k, v, o: [B, H, T, HD]; lse: [B·H, T] float.
template <int HD, class S>
__global__ void __launch_bounds__(kWarps * 32) flash_forward_mma_kernel(Heads<const S> q, Heads<const S> k,
                                                                        Heads<const S> v, Heads<S> o, float* lse,
                                                                        int H, int T, float scale) {
  constexpr int LD = HD + kPad;
  __shared__ alignas(16) uint16_t k_tile[kKeys * LD], v_tile[kKeys * LD];
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  const int r0 = (gridDim.y - 1 - blockIdx.y) * kBlockRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row0 = r0 + warp * kWarpRows;  // this warp's rows

  // Q [16 x HD] as HD/16 A fragments, through shared memory (K's, before the first K tile).
  load_tile_bits<kKeys, HD, LD>(k_tile, q, b, h, r0, T);
  __syncthreads();
  uint32_t qa[HD / mma::kK][4];
  LOOM_UNROLL
  for (int kk = 0; kk < HD / mma::kK; ++kk)
    mma::load_a(lane, k_tile + warp * kWarpRows * LD + kk * mma::kK, LD, qa[kk]);
  __syncthreads();

  RowState<HD> st;
  start_rows(st);
  const int end = min(r0 + kBlockRows, T);  // keys past the block's last query are never needed
  for (int key0 = 0; key0 < end; key0 += kKeys) {
    load_tile_bits<kKeys, HD, LD>(k_tile, k, b, h, key0, T);
    load_tile_bits<kKeys, HD, LD>(v_tile, v, b, h, key0, T);
    __syncthreads();
    float s[kKeyTiles][4] = {};  // S = Q Kᵀ: fragment j holds keys key0 + 8j..
    LOOM_UNROLL
    for (int j = 0; j < kKeyTiles; ++j)
      LOOM_UNROLL
      for (int kk = 0; kk < HD / mma::kK; ++kk) {
        uint32_t kb[2];
        mma::load_b_transposed(lane, k_tile + j * mma::kN * LD + kk * mma::kK, LD, kb);
        mma_m16n8k16<S>(s[j], qa[kk], kb);
      }
    float row_max[2];
    scale_and_mask(lane, s, scale, key0, row0, T, row_max);
    row_max[0] = group_max(row_max[0]);
    row_max[1] = group_max(row_max[1]);
    uint32_t pa[kKeys / mma::kK][4];
    softmax_tile<HD, S>(row_max, s, st, pa);
    LOOM_UNROLL
    for (int kk = 0; kk < kKeys / mma::kK; ++kk)  // O += P V: keys 16kk.. of the tile
      LOOM_UNROLL
      for (int j = 0; j < HD / mma::kN; ++j) {
        uint32_t vb[2];
        mma::load_b(lane, v_tile + kk * mma::kK * LD + j * mma::kN, LD, vb);
        mma_m16n8k16<S>(st.o[j], pa[kk], vb);
      }
    __syncthreads();  // before the next tile overwrites this one
  }
  const float row_sum[2] = {group_sum(st.l[0]), group_sum(st.l[1])};
  float L[2];
  finish_rows(st, row_sum, L);
  LOOM_UNROLL
  for (int r = 0; r < 2; ++r) {  // rows g and g + 8
    const int row = row0 + mma::c_row(lane, 2 * r);
    if (row >= T) continue;
    uint16_t* out = reinterpret_cast<uint16_t*>(o.row(b, h, row));
    LOOM_UNROLL
    for (int j = 0; j < HD / mma::kN; ++j) {
      const uint32_t pair = mma::pack_rounded<S>(st.o[j][2 * r], st.o[j][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(out + j * mma::kN + mma::c_col(lane, 2 * r)) = pair;
    }
    if (lane % 4 == 0) lse[int64_t(blockIdx.x) * T + row] = L[r];
  }
}

}  // namespace

std::string flash_attention_mma_unsupported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.dtype() != kBFloat16 && q.dtype() != kFloat16)
    return str("dtype ", dtype_name(q.dtype()), " (bfloat16 or float16: the tensor cores' operands)");
  if (q.size(3) != 64 && q.size(3) != 128) return str("head size ", q.size(3), " (64 or 128)");
  if (!rows_aligned16(q) || !rows_aligned16(k) || !rows_aligned16(v))
    return "rows not on 16-byte boundaries (its loads are 16 bytes)";
  if ((q.size(2) + kBlockRows - 1) / kBlockRows > 65535)
    return str("sequence length ", q.size(2), " needs over 65535 blocks");
  return "";
}

ops::FlashAttentionResult flash_attention_mma(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const std::string why = flash_attention_mma_unsupported(q, k, v);
  LOOM_CHECK(why.empty(), "flash_attention_mma: ", why);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  // o stored [B, T, H, hd] (heads merged), seen as [B, H, T, hd].
  ops::FlashAttentionResult r{ops::transpose(empty({B, T, H, hd}, q.dtype(), q.device()), 1, 2),
                              empty({B, H, T}, kFloat32, q.device())};
  if (B * H * T == 0) return r;
  DeviceGuard guard(q.device());
  const dim3 grid(unsigned(B * H), unsigned((T + kBlockRows - 1) / kBlockRows));
  cudaStream_t st = stream(q.device());
  auto launch = [&](auto s, auto head) {
    using S = decltype(s);
    constexpr int HD = decltype(head)::value;
    flash_forward_mma_kernel<HD, S><<<grid, kWarps * 32, 0, st>>>(heads_of<const S>(q), heads_of<const S>(k),
                                                                  heads_of<const S>(v), heads_of<S>(r.o),
                                                                  ptr<float>(r.lse), int(H), int(T), float(scale));
  };
  auto by_hd = [&](auto s) {
    if (hd == 64) launch(s, std::integral_constant<int, 64>{});
    else launch(s, std::integral_constant<int, 128>{});
  };
  if (q.dtype() == kBFloat16) by_hd(bfloat16{});
  else by_hd(float16{});
  CUDA_CHECK_LAUNCH();
  return r;
}

}  // namespace loom::cuda
