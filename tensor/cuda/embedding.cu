// Embedding and cross-entropy on the GPU (the CPU versions are in ops_nn.cpp
// and ops_loss.cpp; same results): the two ops that index with token ids.
//
// Bad indices cannot throw from a kernel; the first one is recorded and thrown
// at the next synchronisation (context.h: IndexError). Meanwhile an
// out-of-range embedding row reads as zeros and is skipped in backward; a bad
// target row is left out of the loss.
//
// Embedding backward is deterministic without atomics: one thread per column
// c adds the tokens' gradient rows in token order, dW[idx[i], c] += g[i, c]
// for i = 0, 1, ... - exactly the CPU loop's order per element, so the same
// bits on every run. (Its parallelism is C threads; the fast version,
// fast/embedding_backward_fast.cu, also cuts the vocabulary into slices.)
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/fast/fast_ops.h"
#include "tensor/cuda/launch.cuh"
#include "tensor/kernels/cross_entropy.h"

namespace loom::cuda {
namespace {

DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// out [N, C] = weight [V, C] rows at idx [N]; elements of `bytes` bytes.
__global__ void embedding_kernel(const char* weight, const void* idx, bool idx64, char* out, int64_t N, int64_t V,
                                 int64_t C, int bytes, IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(e, N * C) {
    const int64_t i = e / C, c = e % C;
    const int64_t t = load_index(idx, idx64, i);
    if (t >= 0 && t < V) {
      copy_element(out + e * bytes, weight + (t * C + c) * bytes, bytes);
    } else {
      for (int k = 0; k < bytes; ++k) out[e * bytes + k] = 0;
      if (c == 0) report_index_error(error, IndexOp::Embedding, t, V);
    }
  }
}

// dW [V, C] (zeroed) += g [N, C] rows at idx [N], one thread per column.
template <class T>
__global__ void embedding_backward_kernel(const T* g, const void* idx, bool idx64, T* dw, int64_t N, int64_t V,
                                          int64_t C, IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(c, C) {
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = load_index(idx, idx64, i);
      if (t >= 0 && t < V) dw[t * C + c] += g[i * C + c];
      else if (c == 0) report_index_error(error, IndexOp::EmbeddingBackward, t, V);
    }
  }
}

// One thread per row of logits [N, V]: the row's loss (0 when ignored or bad)
// and whether it counts, both as double for the sums; lse [N] for backward.
template <class T>
__global__ void cross_entropy_kernel(const T* x, const void* targets, bool idx64, int64_t N, int64_t V,
                                     int64_t ignore_index, T* lse, double* loss, double* counted, IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(i, N) {
    const int64_t y = load_index(targets, idx64, i);
    loss[i] = 0;
    counted[i] = 0;
    lse[i] = 0;
    if (y == ignore_index) continue;
    if (y < 0 || y >= V) {
      report_index_error(error, IndexOp::CrossEntropy, y, V);
      continue;
    }
    loss[i] = double(kernels::cross_entropy_row(x + i * V, long(V), long(y), lse + i));
    counted[i] = 1;
  }
}

// dx [N, V] (zeroed) = (softmax - onehot) * grad / count on the rows that count.
// grad is read on the device (no wait for the host to learn it).
template <class T>
__global__ void cross_entropy_backward_kernel(const T* x, const void* targets, bool idx64, const T* lse,
                                              const double* grad, int64_t count, int64_t N, int64_t V,
                                              int64_t ignore_index, T* dx, IndexError* error) {
  LOOM_GRID_STRIDE_LOOP(i, N) {
    const int64_t y = load_index(targets, idx64, i);
    if (y == ignore_index) continue;
    if (y < 0 || y >= V) {
      report_index_error(error, IndexOp::CrossEntropyBackward, y, V);
      continue;
    }
    const T scale = count ? T(*grad / double(count)) : T(0);
    kernels::cross_entropy_backward_row(x + i * V, long(V), long(y), lse[i], scale, dx + i * V);
  }
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  LOOM_CHECK(a.device() == b.device(), op, ": devices differ: ", a.device().str(), " and ", b.device().str());
}

}  // namespace

// weight [V, C], idx any shape (checked by ops::embedding) -> [..., C]
Tensor embedding(const Tensor& weight, const Tensor& idx) {
  check_same_device("embedding", weight, idx);
  Tensor w = ops::contiguous(weight), ic = ops::contiguous(idx);
  const int64_t V = weight.size(0), C = weight.size(1), N = ic.numel();
  Shape out_shape = idx.shape();
  out_shape.push_back(C);
  Tensor out = empty(out_shape, weight.dtype(), weight.device());
  if (N * C == 0) return out;
  DeviceGuard guard(weight.device());
  LaunchConfig c = launch_config(N * C);
  embedding_kernel<<<c.blocks, c.threads, 0, stream(weight.device())>>>(
      static_cast<const char*>(w.raw_data()), ic.raw_data(), ic.dtype() == kInt64, static_cast<char*>(out.raw_data()),
      N, V, C, int(element_size(weight.dtype())), index_error_slot(weight.device()));
  CUDA_CHECK_LAUNCH();
  return out;
}

// grad [..., C], idx [...] -> dW [num_rows, C] in grad's dtype
Tensor embedding_backward(const Tensor& grad, const Tensor& idx, int64_t num_rows) {
  check_same_device("embedding_backward", grad, idx);
  if (fast::use_fast(grad)) return fast::embedding_backward(grad, idx, num_rows);
  const int64_t C = grad.size(-1);
  const DType cd = compute_dtype(grad.dtype());
  Tensor g = ops::contiguous(ops::to(grad, cd)), ic = ops::contiguous(idx);
  Tensor out = zeros({num_rows, C}, cd, grad.device());
  if (C > 0 && ic.numel() > 0) {
    DeviceGuard guard(grad.device());
    LaunchConfig c = launch_config(C);
    cudaStream_t st = stream(grad.device());
    IndexError* error = index_error_slot(grad.device());
    LOOM_DISPATCH_COMPUTE(cd, "embedding_backward", {
      embedding_backward_kernel<<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(g), ic.raw_data(), ic.dtype() == kInt64,
                                                                ptr<scalar_t>(out), ic.numel(), num_rows, C, error);
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(out, grad.dtype());
}

// logits [N, V], targets [N] (checked by ops::cross_entropy). The mean needs the
// count of rows that are not ignored on the host (CrossEntropyResult::count),
// so this op waits for the GPU once - at the loss, where a step logs it anyway.
ops::CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  check_same_device("cross_entropy", logits, targets);
  LOOM_CHECK(is_floating(logits.dtype()), "cross_entropy: expected floating logits, got ", logits.describe());
  const Device dev = logits.device();
  Tensor lse, loss, counted;  // [N] each: the rows' log-sum-exp, loss and whether counted
  if (fast::use_fast(logits)) {
    fast::cross_entropy_rows(logits, targets, ignore_index, lse, loss, counted);
  } else {
    Tensor x = ops::contiguous(ops::to(logits, compute_dtype(logits.dtype()))), t = ops::contiguous(targets);
    const int64_t N = x.size(0), V = x.size(1);
    lse = empty({N}, x.dtype(), dev), loss = empty({N}, kFloat64, dev), counted = empty({N}, kFloat64, dev);
    if (N > 0) {
      DeviceGuard guard(dev);
      LaunchConfig c = launch_config(N);
      cudaStream_t st = stream(dev);
      IndexError* error = index_error_slot(dev);
      LOOM_DISPATCH_COMPUTE(x.dtype(), "cross_entropy", {
        cross_entropy_kernel<<<c.blocks, c.threads, 0, st>>>(ptr<scalar_t>(x), t.raw_data(), t.dtype() == kInt64, N,
                                                             V, ignore_index, ptr<scalar_t>(lse), ptr<double>(loss),
                                                             ptr<double>(counted), error);
      });
      CUDA_CHECK_LAUNCH();
    }
  }
  const int64_t count = int64_t(ops::sum(counted).item<double>());  // waits; throws a bad target found above
  // Mean over non-ignored rows (NaN when every row is ignored, as PyTorch).
  Tensor mean = count ? ops::mul(ops::sum(loss), 1.0 / double(count)) : full({}, std::nan(""), kFloat64, dev);
  return {ops::to(mean, logits.dtype()), lse, count};
}

Tensor cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t count, int64_t ignore_index) {
  check_same_device("cross_entropy_backward", logits, targets);
  check_same_device("cross_entropy_backward", logits, grad);
  LOOM_CHECK(grad.numel() == 1, "cross_entropy_backward: grad must hold one value, got ", grad.shape());
  if (fast::use_fast(logits)) return fast::cross_entropy_backward(grad, logits, targets, lse, count, ignore_index);
  Tensor x = ops::contiguous(ops::to(logits, compute_dtype(logits.dtype()))), t = ops::contiguous(targets);
  Tensor g = ops::contiguous(ops::to(grad, kFloat64)), l = ops::contiguous(lse);
  const int64_t N = x.size(0), V = x.size(1);
  Tensor dx = zeros({N, V}, x.dtype(), logits.device());
  if (N > 0) {
    DeviceGuard guard(logits.device());
    LaunchConfig c = launch_config(N);
    cudaStream_t st = stream(logits.device());
    IndexError* error = index_error_slot(logits.device());
    LOOM_DISPATCH_COMPUTE(x.dtype(), "cross_entropy_backward", {
      cross_entropy_backward_kernel<<<c.blocks, c.threads, 0, st>>>(
          ptr<scalar_t>(x), t.raw_data(), t.dtype() == kInt64, ptr<scalar_t>(l), ptr<double>(g), count, N, V,
          ignore_index, ptr<scalar_t>(dx), error);
    });
    CUDA_CHECK_LAUNCH();
  }
  return ops::to(dx, logits.dtype());
}

}  // namespace loom::cuda
