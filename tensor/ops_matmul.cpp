// matmul: [..., M, K] @ [..., K, N] -> [..., M, N], batch dims broadcast.
// Each 2-D product is one call to oneDNN's dnnl_sgemm or OpenBLAS's
// cblas_sgemm/dgemm (cpu/gemm.h,
// which also says how the math threads share the work). Transposed operands
// are passed as transposed (not copied); bf16/fp16 operands are converted to
// fp32 and the result rounded back.
//
// Why not Eigen's `C.noalias() = A * B` (with EIGEN_USE_BLAS it reaches the
// same sgemm)? Eigen first zeroes C and then calls sgemm with beta = 1, an
// extra write and read of the whole output; bench/gemm measured that pass at
// several percent for the large shapes. Calling sgemm with beta = 0 skips it.
#include <algorithm>
#include <climits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/error.h"
#include "tensor/ops.h"

// LP64 BLAS: ints are 32-bit. The CBLAS enums are ints: NoTrans = 111, Trans = 112.

namespace loom::ops {

namespace {

constexpr int kNoTrans = 111, kTrans = 112;

// One operand matrix [rows, cols] with element strides (rs, cs), as BLAS sees
// it: row-major (cs == 1: NoTrans, leading dim rs) or a transposed view of a
// row-major block (rs == 1: Trans, leading dim cs). A size-1 dim makes its
// stride irrelevant, but BLAS still checks ld >= the row length.
struct BlasOperand {
  int trans;
  int ld;
};

bool matrix_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return (cs == 1 && (rs >= cols || rows == 1)) || (rs == 1 && (cs >= rows || cols == 1));
}

BlasOperand blas_operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 || cols == 1) return {kNoTrans, int(std::max<int64_t>({rs, cols, 1}))};
  return {kTrans, int(std::max<int64_t>({cs, rows, 1}))};
}

// c = a @ b; split over the math threads when `split` (one large product),
// on the calling thread otherwise (one of a batch that is split by products).
template <class T>
void gemm_2d(const T* a, BlasOperand oa, const T* b, BlasOperand ob, T* c, int64_t M, int64_t K, int64_t N,
             bool split) {
  const int64_t ldc = std::max<int64_t>(N, 1);
  if (split) cpu::gemm(oa.trans == kTrans, ob.trans == kTrans, M, N, K, a, oa.ld, b, ob.ld, T(0), c, ldc);
  else cpu::gemm_serial(oa.trans == kTrans, ob.trans == kTrans, M, N, K, a, oa.ld, b, ob.ld, T(0), c, ldc);
}

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  LOOM_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2, "matmul: ", a_in.shape(), " @ ", b_in.shape(),
             ": both operands need at least 2 dims");
  LOOM_CHECK(a_in.dtype() == b_in.dtype(), "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": dtypes differ (",
             dtype_name(a_in.dtype()), " vs ", dtype_name(b_in.dtype()), ")");
  LOOM_CHECK(a_in.device() == b_in.device(), "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": devices differ (",
             a_in.device().str(), " and ", b_in.device().str(), ")");
  int64_t M = a_in.size(-2), K = a_in.size(-1), K2 = b_in.size(-2), N = b_in.size(-1);
  LOOM_CHECK(K == K2, "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": inner dimensions ", K, " and ", K2,
             " differ");
  const DType out_dtype = a_in.dtype();
  const DType compute = out_dtype == kFloat64 ? kFloat64 : kFloat32;
  LOOM_CHECK(is_floating(out_dtype), "matmul: dtype ", dtype_name(out_dtype), " is not supported");
  if (a_in.device().is_cuda()) return cuda::matmul(a_in, b_in);  // cuBLAS (cuda/gemm.cpp)
  check_device_supported("matmul", a_in.device());
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
  if (K == 0) {  // an empty sum: zeros (BLAS may leave C untouched)
    zero_(out);
    return to(out, out_dtype);
  }
  if (out.numel() == 0) return to(out, out_dtype);
  LOOM_CHECK(M < INT_MAX && K < INT_MAX && N < INT_MAX && ae.stride(-2) < INT_MAX && ae.stride(-1) < INT_MAX &&
                 be.stride(-2) < INT_MAX && be.stride(-1) < INT_MAX,
             "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": dimensions exceed BLAS's 32-bit indices");
  const BlasOperand oa = blas_operand(M, K, ae.stride(-2), ae.stride(-1));
  const BlasOperand ob = blas_operand(K, N, be.stride(-2), be.stride(-1));
  LOOM_DISPATCH_COMPUTE(compute, "matmul", {
    {
      const scalar_t* pa = ae.data<scalar_t>();
      const scalar_t* pb = be.data<scalar_t>();
      scalar_t* pc = out.data<scalar_t>();
      const Shape& sa = ae.strides();  // element strides; the batch dims come first
      const Shape& sb = be.strides();
      auto products = [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          int64_t off_a = 0, off_b = 0, rem = i;  // batch offsets of a and b for batch index i
          for (int64_t d = nd - 1; d >= 0; --d) {
            int64_t id = rem % batch[size_t(d)];
            rem /= batch[size_t(d)];
            off_a += id * sa[size_t(d)];
            off_b += id * sb[size_t(d)];
          }
          gemm_2d(pa + off_a, oa, pb + off_b, ob, pc + i * M * N, M, K, N, /*split=*/nb == 1);
        }
      };
      // Many small products (attention's q kᵀ for every batch and head): each
      // thread takes whole products rather than every product being split.
      cpu::blas_single_threaded();
      if (nb > 1) cpu::parallel_for(nb, 1, products);
      else products(0, nb);
    }
  });
  return to(out, out_dtype);
}

// The math threads are OpenMP's (cpu/parallel.h): GEMMs, elementwise and
// per-row loops all split over them; the GEMM library stays single-threaded.
void set_num_threads(int n) {
  if (n <= 0) return;
  cpu::blas_single_threaded();
  cpu::thread_setting() = n;
}
int get_num_threads() { return cpu::max_threads(); }

void set_gemm_library(const std::string& name) {
  if (name == "openblas") {
    cpu::gemm_backend() = cpu::GemmBackend::kOpenBLAS;
    return;
  }
#ifdef LOOM_WITH_DNNL
  if (name == "onednn") {
    cpu::gemm_backend() = cpu::GemmBackend::kOneDNN;
    return;
  }
  const char* available = "openblas, onednn";
#else
  const char* available = "openblas; built without oneDNN";
#endif
  LOOM_CHECK(false, "set_gemm_library: unknown or unavailable library '", name, "' (", available, ")");
}
std::string gemm_library() {
  return cpu::gemm_backend().load() == cpu::GemmBackend::kOneDNN ? "onednn" : "openblas";
}

}  // namespace loom::ops
