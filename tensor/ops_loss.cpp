// The training loss: cross-entropy of logits [N, V] against int targets [N],
// fused (log-softmax + NLL in one pass per row, tensor/kernels/cross_entropy.h).
// Forward saves each row's log-sum-exp, so backward's softmax is one exp per
// element: d logits = (softmax - onehot) * grad / count. Rows whose target is
// ignore_index add nothing to the loss, the count or the gradient. On a GPU
// both hand over to cuda/embedding.cu, which calls the same row functions.
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/rows.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/cross_entropy.h"
#include "tensor/profile.h"
#include "tensor/ops.h"

namespace loom::ops {

using cpu::check_indices;
using cpu::index_at;
using cpu::rows_of;

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  profile::Scope prof("cross_entropy fwd", 4.0 * double(logits.numel()), double(logits.numel()) * double(element_size(logits.dtype())));
  LOOM_CHECK(logits.dim() == 2, "cross_entropy: logits must be [N, V], got ", logits.shape());
  check_indices("cross_entropy", targets);
  LOOM_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy: targets ", targets.shape(),
             " do not match logits ", logits.shape(), " (need [", logits.size(0), "])");
  if (logits.device().is_cuda() || targets.device().is_cuda()) return cuda::cross_entropy(logits, targets, ignore_index);
  Tensor x = rows_of("cross_entropy", logits), t = contiguous(targets);
  int64_t N = x.size(0), V = x.size(1);
  Tensor lse = empty({N}, x.dtype());
  int64_t count = 0;
  double total = 0;
  LOOM_DISPATCH_COMPUTE(x.dtype(), "cross_entropy", {
    {
      for (int64_t i = 0; i < N; ++i) {
        int64_t y = index_at(t, i);
        if (y == ignore_index) { lse.data<scalar_t>()[i] = 0; continue; }
        LOOM_CHECK(y >= 0 && y < V, "cross_entropy: target ", y, " at row ", i, " out of range for ", V,
                   " classes");
        total += double(kernels::cross_entropy_row(x.data<scalar_t>() + i * V, long(V), long(y),
                                                   lse.data<scalar_t>() + i));
        ++count;
      }
    }
  });
  // Mean over non-ignored rows (NaN when every row is ignored, as PyTorch).
  double loss = count ? total / double(count) : std::nan("");
  return {full({}, loss, logits.dtype()), lse, count};
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t count, int64_t ignore_index) {
  profile::Scope prof("cross_entropy bwd", 4.0 * double(logits.numel()), 2.0 * double(logits.numel()) * double(element_size(logits.dtype())));
  if (logits.device().is_cuda()) return cuda::cross_entropy_backward(grad, logits, targets, lse, count, ignore_index);
  Tensor x = rows_of("cross_entropy_backward", logits), t = contiguous(targets);
  int64_t N = x.size(0), V = x.size(1);
  Tensor dx = zeros({N, V}, x.dtype());
  double g = grad.item<double>();
  LOOM_DISPATCH_COMPUTE(x.dtype(), "cross_entropy_backward", {
    {
      scalar_t scale = count ? scalar_t(g / double(count)) : scalar_t(0);
      for (int64_t i = 0; i < N; ++i) {
        int64_t y = index_at(t, i);
        if (y == ignore_index) continue;
        kernels::cross_entropy_backward_row(x.data<scalar_t>() + i * V, long(V), long(y), lse.data<scalar_t>()[i],
                                            scale, dx.data<scalar_t>() + i * V);
      }
    }
  });
  return to(dx, logits.dtype());
}

}  // namespace loom::ops
