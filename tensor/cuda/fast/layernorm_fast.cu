// Fast layer norm forward and backward on the GPU; the reference is rows.cu
// (one thread per row, and one thread per COLUMN for the weight and bias
// gradients, each walking all B*T rows: 768 threads for GPT-2, a few percent
// of an H100). What this file does that the reference does not:
//   - a warp per row (row_team.cuh): coalesced reads, shuffle-tree sums,
//     16-byte loads; mean and variance in two passes over the row
//     (mean, then the squared deviations, as the reference), not Welford:
//     Welford's merge is not symmetric in its two sides, so the butterfly's
//     lanes would end with different bits; a sum's merge (a + b) is;
//   - dw and db in two deterministic passes (kernels/column_partials.h):
//     blocks of 64 rows x all columns each write a partial sum, then one
//     fixed-order sum of the partials per column. No float atomics: the
//     same bits every run.
//
//   x, y, dy, dx: [rows, C] fp32; w, b, dw, db: [C]; mean, rstd: [rows].
#include "tensor/cuda/fast/fast_ops.h"
#include "tensor/cuda/fast/row_team.cuh"
#include "tensor/kernels/column_partials.h"

namespace loom::cuda::fast {
namespace {

using kernels::for_lane_indices;
using kernels::for_lane_values;

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps); w, b may be null.
template <int Vec, class Team>
__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* b, float* y, float* mean,
                                         float* rstd, int64_t rows, int64_t C, float eps) {
  const Team team;
  for (int64_t r = team.first_row(); r < rows; r += team.row_stride()) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float s = 0.0f;
    for_lane_values<Vec>(xr, C, team.lane(), team.lanes(), [&](long, float v) { s += v; });
    const float m = team.reduce(s, Add{}, 0.0f) / float(C);
    float q = 0.0f;
    for_lane_values<Vec>(xr, C, team.lane(), team.lanes(), [&](long, float v) { q += (v - m) * (v - m); });
    const float rs = 1.0f / std::sqrt(team.reduce(q, Add{}, 0.0f) / float(C) + eps);
    for_lane_indices<Vec>(C, team.lane(), team.lanes(), [&](long i) {
      yr[i] = ((xr[i] - m) * rs) * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    });
    if (team.lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// dx = rstd * (g - mean(g) - n * mean(g * n)),  g = dy * w,  n = (x - mean) * rstd
template <int Vec, class Team>
__global__ void layernorm_backward_kernel(const float* dy, const float* x, const float* w, const float* mean,
                                          const float* rstd, float* dx, int64_t rows, int64_t C) {
  const Team team;
  for (int64_t r = team.first_row(); r < rows; r += team.row_stride()) {
    const float *dyr = dy + r * C, *xr = x + r * C;
    float* dxr = dx + r * C;
    const float m = mean[r], rs = rstd[r];
    auto g = [&](long i, float d) { return w ? d * w[i] : d; };
    float sg = 0.0f, sgn = 0.0f;
    for_lane_values<Vec>(dyr, C, team.lane(), team.lanes(), [&](long i, float d) {
      sg += g(i, d);
      sgn += g(i, d) * ((xr[i] - m) * rs);
    });
    const float g_mean = team.reduce(sg, Add{}, 0.0f) / float(C);
    const float gn_mean = team.reduce(sgn, Add{}, 0.0f) / float(C);
    for_lane_indices<Vec>(C, team.lane(), team.lanes(), [&](long i) {
      dxr[i] = rs * (g(i, dyr[i]) - g_mean - ((xr[i] - m) * rs) * gn_mean);
    });
  }
}

// Pass 1: partial_dw/db [blocks, C], row block b (blockIdx.y) x a column per thread.
__global__ void param_grads_partial_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                           float* partial_dw, float* partial_db, int64_t rows, int64_t C,
                                           int64_t blocks) {
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    LOOM_GRID_STRIDE_LOOP(c, C) {
      partial_dw[b * C + c] = kernels::block_column_sum<float>(b, rows, kernels::kRowsPerPartial, [&](long r) {
        return dy[r * C + c] * ((x[r * C + c] - mean[r]) * rstd[r]);  // layernorm_param_grads_row's term
      });
      partial_db[b * C + c] =
          kernels::block_column_sum<float>(b, rows, kernels::kRowsPerPartial, [&](long r) { return dy[r * C + c]; });
    }
  }
}

// Pass 2: dw[c], db[c] = the partials of column c in block order.
__global__ void param_grads_sum_kernel(const float* partial_dw, const float* partial_db, float* dw, float* db,
                                       int64_t C, int64_t blocks) {
  LOOM_GRID_STRIDE_LOOP(c, C) {
    dw[c] = kernels::sum_of_partials(partial_dw, long(blocks), long(C), long(c));
    db[c] = kernels::sum_of_partials(partial_db, long(blocks), long(C), long(c));
  }
}

}  // namespace

ops::LayerNormResult layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  Tensor xc = ops::contiguous(ops::to(x, kFloat32));
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor w = weight.defined() ? ops::contiguous(ops::to(weight, kFloat32)) : Tensor();
  Tensor b = bias.defined() ? ops::contiguous(ops::to(bias, kFloat32)) : Tensor();
  Tensor y = empty(xc.shape(), kFloat32, x.device());
  Tensor mean = empty({rows}, kFloat32, x.device()), rstd = empty({rows}, kFloat32, x.device());
  if (rows > 0) {
    DeviceGuard guard(x.device());
    const RowLaunch l = row_launch(rows, C);
    cudaStream_t st = stream(x.device());
    const float *xp = ptr<float>(xc), *wp = w.defined() ? ptr<float>(w) : nullptr;
    const float* bp = b.defined() ? ptr<float>(b) : nullptr;
    float* yp = ptr<float>(y);
    with_row_variant(l, can_load_float4(C, {xp, yp}), [&](auto vec, auto team) {
      layernorm_forward_kernel<decltype(vec)::value, decltype(team)><<<l.blocks, l.threads, 0, st>>>(
          xp, wp, bp, yp, ptr<float>(mean), ptr<float>(rstd), rows, C, float(eps));
    });
    CUDA_CHECK_LAUNCH();
  }
  return {ops::to(y, x.dtype()), mean, rstd};
}

ops::LayerNormGrads layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd) {
  Tensor gc = ops::contiguous(ops::to(grad, kFloat32)), xc = ops::contiguous(ops::to(x, kFloat32));
  Tensor mc = ops::contiguous(ops::to(mean, kFloat32)), rc = ops::contiguous(ops::to(rstd, kFloat32));
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor w = weight.defined() ? ops::contiguous(ops::to(weight, kFloat32)) : Tensor();
  // dw and db: written whole by pass 2 (zeros when there are no rows).
  Tensor dx = empty(xc.shape(), kFloat32, x.device());
  Tensor dw = rows > 0 ? empty({C}, kFloat32, x.device()) : zeros({C}, kFloat32, x.device());
  Tensor db = rows > 0 ? empty({C}, kFloat32, x.device()) : zeros({C}, kFloat32, x.device());
  if (rows > 0) {
    DeviceGuard guard(x.device());
    cudaStream_t st = stream(x.device());
    const float *gp = ptr<float>(gc), *xp = ptr<float>(xc), *mp = ptr<float>(mc), *rp = ptr<float>(rc);
    const float* wp = w.defined() ? ptr<float>(w) : nullptr;
    float* dxp = ptr<float>(dx);
    const RowLaunch l = row_launch(rows, C);
    with_row_variant(l, can_load_float4(C, {gp, xp, dxp}), [&](auto vec, auto team) {
      layernorm_backward_kernel<decltype(vec)::value, decltype(team)>
          <<<l.blocks, l.threads, 0, st>>>(gp, xp, wp, mp, rp, dxp, rows, C);
    });
    CUDA_CHECK_LAUNCH();
    const int64_t blocks = kernels::partial_blocks(long(rows), kernels::kRowsPerPartial);
    Tensor partial_dw = empty({blocks, C}, kFloat32, x.device()), partial_db = empty({blocks, C}, kFloat32, x.device());
    const LaunchConfig by_column = launch_config(C);
    const dim3 grid(by_column.blocks, unsigned(blocks < 65535 ? blocks : 65535));
    param_grads_partial_kernel<<<grid, by_column.threads, 0, st>>>(gp, xp, mp, rp, ptr<float>(partial_dw),
                                                                    ptr<float>(partial_db), rows, C, blocks);
    CUDA_CHECK_LAUNCH();
    param_grads_sum_kernel<<<by_column.blocks, by_column.threads, 0, st>>>(
        ptr<float>(partial_dw), ptr<float>(partial_db), ptr<float>(dw), ptr<float>(db), C, blocks);
    CUDA_CHECK_LAUNCH();
  }
  const DType wd = weight.defined() ? weight.dtype() : x.dtype();
  return {ops::to(dx, x.dtype()), ops::to(dw, wd), ops::to(db, wd)};
}

}  // namespace loom::cuda::fast
