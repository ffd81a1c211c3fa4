#include "parallel/tensor_parallel/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "tensor/ops.h"

namespace loom::parallel {

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    ProcessGroup& tp, int64_t ignore_index, int64_t vocab_size) {
  LOOM_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0),
             "vocab_parallel_cross_entropy: logits ", logits.shape(), " and targets ", targets.shape(),
             " must be [N, V/tp] and [N]");
  const int64_t N = logits.size(0);
  // v: the columns that are real ids (the rest of the shard is vocab padding).
  const int64_t v = vocab_size < 0 ? logits.size(1)
                                   : std::clamp<int64_t>(vocab_size - vocab_start, 0, logits.size(1));
  const int64_t stride = logits.size(1);
  Tensor x = ops::contiguous(ops::to(logits, kFloat32));
  Tensor t = ops::contiguous(ops::to(targets, kInt64));
  const float* lx = x.data<float>();
  const int64_t* tg = t.data<int64_t>();

  // 1. m: the row max over all ranks.
  Tensor m = full({N}, -std::numeric_limits<double>::infinity(), kFloat32);
  float* pm = m.data<float>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < v; ++j) pm[i] = std::max(pm[i], lx[i * stride + j]);
  tp.all_reduce(m, ReduceOp::Max);
  // 2. S: sum of exp(logit - m) over all ranks; z: the target's logit - m, from its owner.
  Tensor S = zeros({N}, kFloat32), z = zeros({N}, kFloat32);
  float *pS = S.data<float>(), *pz = z.data<float>();
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < v; ++j) pS[i] += std::exp(lx[i * stride + j] - pm[i]);
    const int64_t local = tg[i] - vocab_start;
    if (tg[i] != ignore_index && local >= 0 && local < v) pz[i] = lx[i * stride + local] - pm[i];
  }
  tp.all_reduce(S, ReduceOp::Sum);
  tp.all_reduce(z, ReduceOp::Sum);
  // 3. The mean of log S - z over the counted rows.
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i)
    if (tg[i] != ignore_index) total += std::log(double(pS[i])) - double(pz[i]), ++count;
  Tensor loss = full({}, count ? total / double(count) : 0.0, kFloat32);

  // Backward: (softmax - onehot) * g / count, this rank's columns only.
  return autograd::record(
      "VocabParallelCrossEntropyBackward", {&logits}, loss,
      [x, t, m, S, v, vocab_start, ignore_index, count, dtype = logits.dtype()](const autograd::TensorList& g) {
        const int64_t N = x.size(0), stride = x.size(1);
        Tensor grad = zeros({N, stride}, kFloat32);
        const float scale = count ? float(g[0].item<double>() / double(count)) : 0.0f;
        const float *lx = x.data<float>(), *pm = m.data<float>(), *pS = S.data<float>();
        const int64_t* tg = t.data<int64_t>();
        float* d = grad.data<float>();
        for (int64_t i = 0; i < N; ++i) {
          if (tg[i] == ignore_index) continue;
          for (int64_t j = 0; j < v; ++j) d[i * stride + j] = std::exp(lx[i * stride + j] - pm[i]) / pS[i] * scale;
          const int64_t local = tg[i] - vocab_start;
          if (local >= 0 && local < v) d[i * stride + local] -= scale;
        }
        return autograd::TensorList{ops::to(grad, dtype)};
      });
}

}  // namespace loom::parallel
