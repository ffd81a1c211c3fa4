// matmul: [..., M, K] @ [..., K, N] -> [..., M, N], batch dims broadcast.
// Each 2-D product is one call to oneDNN's dnnl_sgemm or OpenBLAS's
// cblas_sgemm/dgemm (cpu/gemm.h, which also says how the math threads share
// the work). Transposed operands are passed as transposed (not copied).
// bf16 operands: on a CPU with AVX512_BF16 (or AMX) and oneDNN they stay
// bf16 and run oneDNN's bf16 matmul with fp32 accumulation, which writes the
// bf16 result itself (cpu/gemm_bf16.h); elsewhere, or with
// LOOM_GEMM_BF16=fp32, they are converted to fp32 like fp16 operands,
// multiplied by sgemm, and the result rounded back.
//
// Why not Eigen's `C.noalias() = A * B` (with EIGEN_USE_BLAS it reaches the
// same sgemm)? Eigen first zeroes C and then calls sgemm with beta = 1, an
// extra write and read of the whole output; bench/gemm measured that pass at
// several percent for the large shapes. Calling sgemm with beta = 0 skips it.
#include <algorithm>
#include <climits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/error.h"
#include "tensor/profile.h"
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
// bf16 operands and c: the native bf16 path.
void gemm_2d(const bfloat16* a, BlasOperand oa, const bfloat16* b, BlasOperand ob, bfloat16* c, int64_t M, int64_t K,
             int64_t N, bool split) {
  const int64_t ldc = std::max<int64_t>(N, 1);
  if (split) cpu::gemm_bf16(oa.trans == kTrans, ob.trans == kTrans, M, N, K, a, oa.ld, b, ob.ld, 0.0f, c, ldc);
  else cpu::gemm_bf16_serial(oa.trans == kTrans, ob.trans == kTrans, M, N, K, a, oa.ld, b, ob.ld, 0.0f, c, ldc);
}

// out [batch..., M, N] = ae [batch..., M, K] @ be [batch..., K, N], operands
// already expanded to the batch (stride 0 where broadcast), all of type T.
template <class T>
void batched_gemm(const Tensor& ae, const Tensor& be, Tensor& out, const Shape& batch, int64_t M, int64_t K,
                  int64_t N) {
  const BlasOperand oa = blas_operand(M, K, ae.stride(-2), ae.stride(-1));
  const BlasOperand ob = blas_operand(K, N, be.stride(-2), be.stride(-1));
  const T* pa = ae.data<T>();
  const T* pb = be.data<T>();
  T* pc = out.data<T>();
  const Shape& sa = ae.strides();  // element strides; the batch dims come first
  const Shape& sb = be.strides();
  const int64_t nb = numel_of(batch), nd = int64_t(batch.size());
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
  if (nb > 1) cpu::parallel_for_tasks(nb, products);
  else products(0, nb);
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
  const int64_t pb = std::max(a_in.numel() / std::max<int64_t>(1, M * K), b_in.numel() / std::max<int64_t>(1, K * N));
  profile::Scope prof([&] { return "matmul " + std::to_string(pb) + " x " + profile::shape(M, K, N); },
                      2.0 * double(pb * M * K * N),
                      double(pb * (M * K + K * N + M * N)) * double(element_size(a_in.dtype())));
  const DType out_dtype = a_in.dtype();
  const DType compute = out_dtype == kFloat64 ? kFloat64 : kFloat32;
  LOOM_CHECK(is_floating(out_dtype), "matmul: dtype ", dtype_name(out_dtype), " is not supported");
  if (a_in.device().is_cuda()) return cuda::matmul(a_in, b_in);  // cuBLAS (cuda/gemm.cpp)
  check_device_supported("matmul", a_in.device());
  // bf16 operands stay bf16 where the CPU multiplies them natively; others are widened.
  const DType operand = out_dtype == kBFloat16 && cpu::bf16_gemm_enabled() ? kBFloat16 : compute;
  Tensor a = to(a_in, operand), b = to(b_in, operand);

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
  Tensor out = empty(out_shape, operand);  // bf16 straight from the native path, else fp32/fp64
  Shape full_a = batch, full_b = batch;
  full_a.push_back(M); full_a.push_back(K);
  full_b.push_back(K); full_b.push_back(N);
  Tensor ae = expand(a, full_a), be = expand(b, full_b);
  if (!matrix_ok(M, K, ae.stride(-2), ae.stride(-1))) ae = contiguous(ae);
  if (!matrix_ok(K, N, be.stride(-2), be.stride(-1))) be = contiguous(be);
  if (K == 0) {  // an empty sum: zeros (BLAS may leave C untouched)
    zero_(out);
    return to(out, out_dtype);
  }
  if (out.numel() == 0) return to(out, out_dtype);
  LOOM_CHECK(M < INT_MAX && K < INT_MAX && N < INT_MAX && ae.stride(-2) < INT_MAX && ae.stride(-1) < INT_MAX &&
                 be.stride(-2) < INT_MAX && be.stride(-1) < INT_MAX,
             "matmul: ", a_in.shape(), " @ ", b_in.shape(), ": dimensions exceed BLAS's 32-bit indices");
  if (operand == kBFloat16) batched_gemm<bfloat16>(ae, be, out, batch, M, K, N);
  else LOOM_DISPATCH_COMPUTE(compute, "matmul", { batched_gemm<scalar_t>(ae, be, out, batch, M, K, N); });
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

void set_bf16_gemm(const std::string& mode) {
  LOOM_CHECK(mode == "bf16" || mode == "fp32", "set_bf16_gemm: unknown mode '", mode, "' (bf16, fp32)");
  LOOM_CHECK(mode == "fp32" || cpu::bf16_gemm_hardware(), "set_bf16_gemm: bf16 needs a CPU with AVX512_BF16 or AMX ",
             "and a build with oneDNN");
  cpu::bf16_gemm_switch() = mode == "bf16";
}
std::string bf16_gemm() { return cpu::bf16_gemm_enabled() ? "bf16" : "fp32"; }

}  // namespace loom::ops
