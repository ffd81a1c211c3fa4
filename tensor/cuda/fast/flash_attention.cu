// Flash attention's forward on the GPU (Dao et al. 2022; FlashAttention-2's
// loop order): O = softmax(causal(scale q kᵀ)) v without the [T, T] matrix.
//
// What it does that the composition (nn/attention.h) does not: the
// composition writes the scores and the weights, B·H·T² numbers each, to
// global memory and reads them back (GPT-2 124M, B 16, T 1024: 805 MB per
// matrix per layer in fp32, twice half of it masked). Here a block of kRows
// = 64 threads owns 64 query rows, one each, its q row and output sum acc in
// registers; the block walks the keys in tiles of kKeyTile = 32 rows of k and
// v staged in shared memory (every thread reads the same k/v element at once:
// a broadcast, no bank conflicts) and folds each tile into its rows with the
// online softmax (tensor/kernels/flash_attention.h: running max m, sum l).
// Tiles past the block's last query are never loaded (causal skipping: about
// half of them), and the diagonal tile masks keys in each row's future.
// Memory traffic per query row is O(T·hd) for k and v shared by 64 rows and
// O(hd) for q and o; what is saved for backward is o and one log-sum-exp L
// per row. The scores are fp32 FMAs on the CUDA cores (not tensor cores:
// the next step), with bf16/fp16 inputs widened to fp32 as they are loaded.
//
// Grid: x = B·H heads, y = query blocks, the last (longest: they see every
// key) first. Shared memory: 2 · 32 · HD floats = 16 KiB at HD = 64.
#include "tensor/cuda/fast/flash_attention.h"
#include "tensor/cuda/fast/flash_tiles.cuh"
#include "tensor/ops.h"

namespace loom::cuda {
namespace {

using namespace flash;

// q, k, v, o: [B, H, T, hd]; lse: [B·H, T] float.
template <int HD, class S>
__global__ void __launch_bounds__(kRows) flash_forward_kernel(Heads<const S> q, Heads<const S> k, Heads<const S> v,
                                                              Heads<S> o, float* lse, int H, int T, int hd,
                                                              float scale) {
  __shared__ float k_tile[kKeyTile * HD], v_tile[kKeyTile * HD];
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  const int r0 = (gridDim.y - 1 - blockIdx.y) * kRows, i = r0 + threadIdx.x;  // this thread's query row
  float q_i[HD], acc[HD], m = -INFINITY, l = 0.f;
  load_row<HD>(q_i, q.row(b, h, i), i < T, hd);
  LOOM_UNROLL
  for (int d = 0; d < HD; ++d) acc[d] = 0.f;
  const int end = min(r0 + kRows, T);  // keys past the block's last query are never needed
  for (int key0 = 0; key0 < end; key0 += kKeyTile) {
    load_tile<kKeyTile, HD>(k_tile, k, b, h, key0, T, hd);
    load_tile<kKeyTile, HD>(v_tile, v, b, h, key0, T, hd);
    __syncthreads();
    float s[kKeyTile];
    score_tile<HD>(q_i, k_tile, key0, i, T, scale, s);
    online_softmax_update<HD>(s, v_tile, m, l, acc);
    __syncthreads();  // before the next tile overwrites this one
  }
  const float L = finish_row<HD>(m, l, acc);
  if (i < T) {
    store_row<HD>(o.row(b, h, i), acc, hd, 1.f);
    lse[int64_t(blockIdx.x) * T + i] = L;
  }
}

}  // namespace

ops::FlashAttentionResult flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  // o stored [B, T, H, hd] (heads merged), seen as [B, H, T, hd].
  ops::FlashAttentionResult r{ops::transpose(empty({B, T, H, hd}, q.dtype(), q.device()), 1, 2),
                              empty({B, H, T}, kFloat32, q.device())};
  if (B * H * T == 0) return r;
  LOOM_CHECK((T + kRows - 1) / kRows <= 65535, "flash_attention: T ", T, " needs more than 65535 blocks of ", kRows);
  DeviceGuard guard(q.device());
  const dim3 grid(unsigned(B * H), unsigned((T + kRows - 1) / kRows));
  cudaStream_t st = stream(q.device());
  dispatch(q.dtype(), hd, [&](auto s, auto padded) {
    using S = decltype(s);
    constexpr int HD = decltype(padded)::value;
    flash_forward_kernel<HD, S><<<grid, kRows, 0, st>>>(heads_of<const S>(q), heads_of<const S>(k),
                                                        heads_of<const S>(v), heads_of<S>(r.o), ptr<float>(r.lse),
                                                        int(H), int(T), int(hd), float(scale));
  });
  CUDA_CHECK_LAUNCH();
  return r;
}

}  // namespace loom::cuda
