// Fast cross-entropy over a vocabulary, forward and backward, on the GPU;
// the reference is embedding.cu, one thread per row: for GPT-2 (V = 50257)
// each thread walks 50257 logits twice, alone. What this file does that the
// reference does not:
//   - a block of 512 threads per row (a warp for V <= 1024; row_team.cuh):
//     coalesced reads, 16-byte loads when V is a multiple of 4;
//   - the online softmax (kernels/online_softmax.h): the row's max and
//     sum of exponentials in ONE read of the logits, combined by shuffles;
//   - backward writes every value of dx itself (ignored rows get zeros),
//     so dx needs no memset first.
// Same loss and lse as the reference up to the order of the sum.
//
//   logits [N, V] fp32, targets [N] int32/int64; lse [N]; loss, counted [N] double (summed on the GPU).
#include <cmath>

#include "tensor/cuda/fast/fast_ops.h"
#include "tensor/cuda/fast/row_team.cuh"

namespace loom::cuda::fast {
namespace {

using kernels::for_lane_indices;
using kernels::for_lane_values;

// loss = (max - x[target]) + log s, lse = max + log s (kernels::cross_entropy_row's forms).
template <int Vec, class Team>
__global__ void cross_entropy_kernel(const float* x, const void* targets, bool idx64, int64_t N, int64_t V,
                                     int64_t ignore_index, float* lse, double* loss, double* counted,
                                     IndexError* error) {
  const Team team;
  for (int64_t r = team.first_row(); r < N; r += team.row_stride()) {
    const int64_t y = load_index(targets, idx64, r);
    const bool bad = y != ignore_index && (y < 0 || y >= V);
    if (y == ignore_index || bad) {  // the whole team takes this branch
      if (team.lane() == 0) {
        loss[r] = counted[r] = 0;
        lse[r] = 0;
        if (bad) report_index_error(error, IndexOp::CrossEntropy, y, V);
      }
      continue;
    }
    const float* xr = x + r * V;
    MaxSum<float> ms = kernels::max_sum_empty<float>();
    for_lane_values<Vec>(xr, V, team.lane(), team.lanes(), [&](long, float v) { kernels::max_sum_add(ms, v); });
    ms = team.reduce(ms, MaxSumMerge{}, kernels::max_sum_empty<float>());
    if (team.lane() == 0) {
      const float log_s = std::log(ms.s);
      lse[r] = ms.m + log_s;
      loss[r] = double((ms.m - xr[y]) + log_s);
      counted[r] = 1;
    }
  }
}

// dx[i] = (exp(x[i] - lse) - [i == target]) * grad / count; 0 on ignored and bad rows.
template <int Vec, class Team>
__global__ void cross_entropy_backward_kernel(const float* x, const void* targets, bool idx64, const float* lse,
                                              const double* grad, int64_t count, int64_t N, int64_t V,
                                              int64_t ignore_index, float* dx, IndexError* error) {
  const Team team;
  const float scale = count ? float(*grad / double(count)) : 0.0f;
  for (int64_t r = team.first_row(); r < N; r += team.row_stride()) {
    const int64_t y = load_index(targets, idx64, r);
    float* dxr = dx + r * V;
    if (y == ignore_index || y < 0 || y >= V) {
      if (y != ignore_index && team.lane() == 0) report_index_error(error, IndexOp::CrossEntropyBackward, y, V);
      for_lane_indices<Vec>(V, team.lane(), team.lanes(), [&](long i) { dxr[i] = 0.0f; });
      continue;
    }
    const float l = lse[r];
    for_lane_values<Vec>(x + r * V, V, team.lane(), team.lanes(), [&](long i, float v) {
      dxr[i] = (kernels::exp_approx(v - l) - (i == y ? 1.0f : 0.0f)) * scale;
    });
  }
}

}  // namespace

void cross_entropy_rows(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& lse, Tensor& loss,
                        Tensor& counted) {
  Tensor x = ops::contiguous(ops::to(logits, kFloat32)), t = ops::contiguous(targets);
  const int64_t N = x.size(0), V = x.size(1);
  const Device dev = logits.device();
  lse = empty({N}, kFloat32, dev), loss = empty({N}, kFloat64, dev), counted = empty({N}, kFloat64, dev);
  if (N == 0) return;
  DeviceGuard guard(dev);
  const RowLaunch l = row_launch(N, V);
  cudaStream_t st = stream(dev);
  const float* xp = ptr<float>(x);
  with_row_variant(l, can_load_float4(V, {xp}), [&](auto vec, auto team) {
    cross_entropy_kernel<decltype(vec)::value, decltype(team)><<<l.blocks, l.threads, 0, st>>>(
        xp, t.raw_data(), t.dtype() == kInt64, N, V, ignore_index, ptr<float>(lse), ptr<double>(loss),
        ptr<double>(counted), index_error_slot(dev));
  });
  CUDA_CHECK_LAUNCH();
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t count, int64_t ignore_index) {
  Tensor x = ops::contiguous(ops::to(logits, kFloat32)), t = ops::contiguous(targets);
  Tensor g = ops::contiguous(ops::to(grad, kFloat64)), l = ops::contiguous(ops::to(lse, kFloat32));
  const int64_t N = x.size(0), V = x.size(1);
  Tensor dx = empty({N, V}, kFloat32, logits.device());
  if (N > 0 && V > 0) {
    DeviceGuard guard(logits.device());
    const RowLaunch rl = row_launch(N, V);
    cudaStream_t st = stream(logits.device());
    const float* xp = ptr<float>(x);
    float* dxp = ptr<float>(dx);
    with_row_variant(rl, can_load_float4(V, {xp, dxp}), [&](auto vec, auto team) {
      cross_entropy_backward_kernel<decltype(vec)::value, decltype(team)><<<rl.blocks, rl.threads, 0, st>>>(
          xp, t.raw_data(), t.dtype() == kInt64, ptr<float>(l), ptr<double>(g), count, N, V, ignore_index, dxp,
          index_error_slot(logits.device()));
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(dx, logits.dtype());
}

}  // namespace loom::cuda::fast
