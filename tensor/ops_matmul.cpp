// matmul: [..., M, K] @ [..., K, N] -> [..., M, N], batch dims broadcast.
// Each 2-D product goes to Eigen, which hands it to OpenBLAS's sgemm/dgemm
// (EIGEN_USE_BLAS). Transposed operands are passed as transposed maps, not
// copied; bf16/fp16 operands are converted to fp32 and the result rounded back.
#include <Eigen/Core>

#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

extern "C" void openblas_set_num_threads(int);
extern "C" int openblas_get_num_threads(void);

namespace loom::ops {

namespace {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;

// One operand matrix [rows, cols] at p with strides (rs, cs): row-major if
// cs == 1, a transposed (column-major) view if rs == 1.
template <class T, class F>
void with_matrix(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, F f) {
  using Stride = Eigen::OuterStride<>;
  if (cs == 1 || cols == 1) {
    Eigen::Map<const RowMat<T>, 0, Stride> m(p, rows, cols, Stride(cols == 1 && cs != 1 ? std::max<int64_t>(rs, 1) : std::max<int64_t>(rs, cols)));
    f(m);
  } else {
    Eigen::Map<const ColMat<T>, 0, Stride> m(p, rows, cols, Stride(std::max<int64_t>(cs, rows)));
    f(m);
  }
}

bool matrix_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return (cs == 1 && (rs >= cols || rows == 1)) || (rs == 1 && (cs >= rows || cols == 1));
}

template <class T>
void gemm_2d(const T* a, int64_t ars, int64_t acs, const T* b, int64_t brs, int64_t bcs, T* c, int64_t M, int64_t K,
             int64_t N) {
  Eigen::Map<RowMat<T>> C(c, M, N);
  with_matrix(a, M, K, ars, acs, [&](const auto& A) {
    with_matrix(b, K, N, brs, bcs, [&](const auto& B) { C.noalias() = A * B; });
  });
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  LOOM_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2, "matmul: ", a_in.shape(), " @ ", b_in.shape(),
             ": both operands need at least 2 dims");
  LOOM_CHECK(a_in.dtype() == b_in.dtype(), "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": dtypes differ (",
             dtype_name(a_in.dtype()), " vs ", dtype_name(b_in.dtype()), ")");
  check_device_supported("matmul", a_in.device());
  int64_t M = a_in.size(-2), K = a_in.size(-1), K2 = b_in.size(-2), N = b_in.size(-1);
  LOOM_CHECK(K == K2, "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": inner dimensions ", K, " and ", K2,
             " differ");
  const DType out_dtype = a_in.dtype();
  const DType compute = out_dtype == kFloat64 ? kFloat64 : kFloat32;
  LOOM_CHECK(is_floating(out_dtype), "matmul: dtype ", dtype_name(out_dtype), " is not supported");
  Tensor a = to(a_in, compute), b = to(b_in, compute);

  // [..., M, K] @ [K, N]: fold the batch dims into M for one large GEMM.
  if (b.dim() == 2 && a.dim() > 2) {
    Tensor a2 = reshape(a, {-1, K});
    Shape out_shape = a.shape();
    out_shape.back() = N;
    return reshape(to(matmul(a2, b), out_dtype), out_shape);
  }

  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes("matmul", batch_a, batch_b);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = empty(out_shape, compute);
  Shape full_a = batch, full_b = batch;
  full_a.push_back(M); full_a.push_back(K);
  full_b.push_back(K); full_b.push_back(N);
  Tensor ae = expand(a, full_a), be = expand(b, full_b);
  if (!matrix_ok(M, K, ae.stride(-2), ae.stride(-1))) ae = contiguous(ae);
  if (!matrix_ok(K, N, be.stride(-2), be.stride(-1))) be = contiguous(be);
  int64_t nb = numel_of(batch);
  int64_t nd = int64_t(batch.size());
  LOOM_DISPATCH_COMPUTE(compute, "matmul", {
    {
      const scalar_t* pa = ae.data<scalar_t>();
      const scalar_t* pb = be.data<scalar_t>();
      scalar_t* pc = out.data<scalar_t>();
      for (int64_t i = 0; i < nb; ++i) {
        int64_t oa = 0, ob = 0, rem = i;  // batch offsets of a and b for batch index i
        for (int64_t d = nd - 1; d >= 0; --d) {
          int64_t id = rem % batch[size_t(d)];
          rem /= batch[size_t(d)];
          oa += id * ae.stride(d);
          ob += id * be.stride(d);
        }
        gemm_2d(pa + oa, ae.stride(-2), ae.stride(-1), pb + ob, be.stride(-2), be.stride(-1), pc + i * M * N, M, K, N);
      }
    }
  });
  return to(out, out_dtype);
}

void set_num_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
}
int get_num_threads() { return openblas_get_num_threads(); }

}  // namespace loom::ops
