// Fast softmax, log-softmax and causal softmax (+ backwards) on the GPU; the
// reference is rows.cu, one thread per row. What this file does that the
// reference does not, and why it is faster:
//   - a warp per row (a block past 1024 values, row_team.cuh): a warp's 32
//     threads read 32 neighbouring values of one row, one memory transaction,
//     instead of 32 rows' values 4n bytes apart;
//   - 16-byte loads (4 floats) when the rows are aligned (kernels/row_lanes.h);
//   - the online softmax (kernels/online_softmax.h): max and sum in one read
//     of the row, not two;
//   - the lanes' partial results combined by warp shuffles, in registers.
// Sums run in another order than the reference's 16 lanes, so results agree
// to rounding, not bit for bit; the same input gives the same bits every run.
//
//   x, y, dy, dx: [..., n] seen as [rows, n], fp32 (bf16/fp16 convert in and out as in rows.cu).
#include "tensor/cuda/fast/fast_ops.h"
#include "tensor/cuda/fast/row_team.cuh"

namespace loom::cuda::fast {
namespace {

using kernels::for_lane_indices;
using kernels::for_lane_values;

Tensor rows_fp32(const Tensor& x) { return ops::contiguous(ops::to(x, kFloat32)); }

// Row r sees its first `visible` values: all n, or for causal scores [.., T, S]
// (causal_T = T) query r % T sees keys 0..r % T.
__device__ __forceinline__ long visible_of(int64_t r, int64_t n, int64_t causal_T) {
  if (causal_T == 0) return long(n);
  const int64_t v = r % causal_T + 1;
  return long(v < n ? v : n);
}

// softmax (log = false) or log_softmax (log = true) of scale * x over each
// row's visible values; 0 past them (the causal mask).
template <int Vec, class Team>
__global__ void softmax_forward_kernel(const float* x, float* y, int64_t rows, int64_t n, int64_t causal_T,
                                       float scale, bool log) {
  const Team team;
  for (int64_t r = team.first_row(); r < rows; r += team.row_stride()) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const long visible = visible_of(r, n, causal_T);
    MaxSum<float> ms = kernels::max_sum_empty<float>();
    for_lane_values<Vec>(xr, visible, team.lane(), team.lanes(),
                         [&](long, float v) { kernels::max_sum_add(ms, v * scale); });
    ms = team.reduce(ms, MaxSumMerge{}, kernels::max_sum_empty<float>());
    if (log) {
      const float log_s = std::log(ms.s);
      for_lane_indices<Vec>(n, team.lane(), team.lanes(), [&](long i) { yr[i] = (xr[i] - ms.m) - log_s; });
    } else {
      const float inv = 1.0f / ms.s;
      for_lane_indices<Vec>(n, team.lane(), team.lanes(), [&](long i) {
        yr[i] = i < visible ? kernels::exp_approx(xr[i] * scale - ms.m) * inv : 0.0f;
      });
    }
  }
}

enum class Backward { Softmax, LogSoftmax };

// softmax:     dx = scale * y * (dy - sum(dy * y))  on the visible values, 0 past them
// log_softmax: dx = dy - exp(y) * sum(dy)
template <int Vec, class Team>
__global__ void softmax_backward_kernel(const float* dy, const float* y, float* dx, int64_t rows, int64_t n,
                                        int64_t causal_T, float scale, Backward kind) {
  const Team team;
  for (int64_t r = team.first_row(); r < rows; r += team.row_stride()) {
    const float *dyr = dy + r * n, *yr = y + r * n;
    float* dxr = dx + r * n;
    const long visible = visible_of(r, n, causal_T);
    float s = 0.0f;
    if (kind == Backward::Softmax)
      for_lane_values<Vec>(dyr, visible, team.lane(), team.lanes(), [&](long i, float d) { s += d * yr[i]; });
    else
      for_lane_values<Vec>(dyr, n, team.lane(), team.lanes(), [&](long, float d) { s += d; });
    s = team.reduce(s, Add{}, 0.0f);
    for_lane_indices<Vec>(n, team.lane(), team.lanes(), [&](long i) {
      if (kind == Backward::LogSoftmax) dxr[i] = dyr[i] - kernels::exp_approx(yr[i]) * s;
      else if (causal_T == 0) dxr[i] = yr[i] * (dyr[i] - s);
      else dxr[i] = i < visible ? (yr[i] * (dyr[i] - s)) * scale : 0.0f;
    });
  }
}

Tensor forward(const Tensor& x, int64_t causal_T, double scale, bool log) {
  Tensor xc = rows_fp32(x);
  Tensor y = empty(xc.shape(), kFloat32, x.device());
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  if (rows > 0) {
    DeviceGuard guard(x.device());
    const RowLaunch l = row_launch(rows, n);
    cudaStream_t st = stream(x.device());
    const float *xp = ptr<float>(xc);
    float* yp = ptr<float>(y);
    with_row_variant(l, can_load_float4(n, {xp, yp}), [&](auto vec, auto team) {
      softmax_forward_kernel<decltype(vec)::value, decltype(team)>
          <<<l.blocks, l.threads, 0, st>>>(xp, yp, rows, n, causal_T, float(scale), log);
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(y, x.dtype());
}

Tensor backward(const char* op, const Tensor& g, const Tensor& y, int64_t causal_T, double scale, Backward kind) {
  LOOM_CHECK(g.shape() == y.shape(), op, ": grad ", g.shape(), " and output ", y.shape(), " differ");
  LOOM_CHECK(g.device() == y.device(), op, ": grad on ", g.device().str(), ", output on ", y.device().str());
  Tensor gc = rows_fp32(g), yc = rows_fp32(y);
  Tensor dx = empty(gc.shape(), kFloat32, g.device());
  const int64_t n = y.size(-1), rows = n ? y.numel() / n : 0;
  if (rows > 0) {
    DeviceGuard guard(y.device());
    const RowLaunch l = row_launch(rows, n);
    cudaStream_t st = stream(y.device());
    const float *gp = ptr<float>(gc), *yp = ptr<float>(yc);
    float* dxp = ptr<float>(dx);
    with_row_variant(l, can_load_float4(n, {gp, yp, dxp}), [&](auto vec, auto team) {
      softmax_backward_kernel<decltype(vec)::value, decltype(team)>
          <<<l.blocks, l.threads, 0, st>>>(gp, yp, dxp, rows, n, causal_T, float(scale), kind);
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(dx, g.dtype());
}

}  // namespace

Tensor softmax(const Tensor& x) { return forward(x, 0, 1.0, false); }
Tensor log_softmax(const Tensor& x) { return forward(x, 0, 1.0, true); }
Tensor causal_softmax(const Tensor& x, double scale) { return forward(x, x.size(-2), scale, false); }

Tensor softmax_backward(const Tensor& grad, const Tensor& y) {
  return backward("softmax_backward", grad, y, 0, 1.0, Backward::Softmax);
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y) {
  return backward("log_softmax_backward", grad, y, 0, 1.0, Backward::LogSoftmax);
}
Tensor causal_softmax_backward(const Tensor& grad, const Tensor& y, double scale) {
  return backward("causal_softmax_backward", grad, y, y.size(-2), scale, Backward::Softmax);
}

}  // namespace loom::cuda::fast
