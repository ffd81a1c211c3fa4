// linear: y = x @ wᵀ + b, the Linear layer as one op (PyTorch's F.linear).
//
// Why not matmul + add: one output, no second allocation; the bias goes onto
// each row of x @ wᵀ right after the GEMM (fp32/fp64) or is written into the
// output first and the GEMM accumulates onto it (BLAS beta = 1, as PyTorch's
// addmm does; bf16, where the GEMM adds in fp32 and rounds once). Why not
// beta = 1 for fp32 too: the step keeps each Linear output for backward, so
// it lands in memory no cache holds; the prefill's writes and the GEMM's reads
// of it then cost more than a bias pass after a beta = 0 GEMM (small GPT's
// [1024, 128] @ [128, 512]ᵀ, output not in cache: 1,474 against 1,362 us, one
// thread, AVX-512; ~1.1 ms of the small step; bench/README.md).
//
// Backward produces every gradient in its parameter's own layout: dW = gᵀ @ x
// is [out, in] like the weight (the matmul route computes xᵀ @ g and leaves a
// transposed view that AccumulateGrad must copy), and db is a column sum in double, rounded once
// (what sum_to would give). bf16 operands go to the native bf16 GEMM where the
// CPU has one (cpu/gemm_bf16.h: fp32 accumulation, bf16 written by the GEMM),
// else to fp32 and back.
//
//   x: [..., K]   w: [N, K]   b: [N]   ->   y: [..., N]
#include <algorithm>
#include <cstring>

#include "tensor/cpu/bias_gelu.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gemm.h"
#include "tensor/cpu/gemm_bf16.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/profile.h"
#include "tensor/ops.h"

namespace loom::ops {

namespace {

DType compute_of(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }
// The dtype the GEMMs read: bf16 stays bf16 where the CPU multiplies it natively.
DType operand_of(DType t) { return t == kBFloat16 && cpu::bf16_gemm_enabled() ? kBFloat16 : compute_of(t); }

// C [m, n] = beta C + op(A) op(B), all row-major and contiguous (ld = row
// length), beta 0 or 1; all bf16 (the native path) or all fp32/fp64.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& a, const Tensor& b, bool beta_one,
          Tensor& c) {
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  if (a.dtype() == kBFloat16) {
    cpu::gemm_bf16(ta, tb, m, n, k, a.data<bfloat16>(), lda, b.data<bfloat16>(), ldb, beta_one ? 1.0f : 0.0f,
                   c.data<bfloat16>(), n);
    return;
  }
  LOOM_DISPATCH_COMPUTE(c.dtype(), "linear", {
    cpu::gemm(ta, tb, m, n, k, a.data<scalar_t>(), lda, b.data<scalar_t>(), ldb, scalar_t(beta_one),
              c.data<scalar_t>(), n);
  });
}

// db [N] = column sums of g [M, N], accumulated in double row by row. Threads
// own columns; each column sums its rows in order. 32 columns at a time, their
// sums held in registers down all M rows (a running sum in memory per row cost
// a load and a store per element).
template <class T>
void column_sums(const T* g, int64_t M, int64_t N, double* a) {
  constexpr int64_t kCols = 32;
  cpu::parallel_for(N, std::max<int64_t>(16, 16384 / std::max<int64_t>(M, 1)), [&](int64_t j0, int64_t j1) {
    for (int64_t jb = j0; jb < j1; jb += kCols) {
      const int64_t w = std::min(kCols, j1 - jb);
      double s[kCols] = {};
      if (w == kCols) {
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < kCols; ++j) s[j] += double(cpu::to_acc(g[i * N + jb + j]));
      } else {
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < w; ++j) s[j] += double(cpu::to_acc(g[i * N + jb + j]));
      }
      for (int64_t j = 0; j < w; ++j) a[jb + j] = s[j];
    }
  });
}

void check_linear(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  LOOM_CHECK(w.device() == x.device() && (!b.defined() || b.device() == x.device()), op, ": input on ",
             x.device().str(), ", weight on ", w.device().str(), b.defined() ? ", bias on " + b.device().str() : "",
             ": devices differ");
  LOOM_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), op, ": input ", x.describe(),
             " does not match weight ", w.describe(), " (need [..., in] and [out, in])");
  LOOM_CHECK(is_floating(x.dtype()) && w.dtype() == x.dtype(), op, ": input ", x.describe(), " and weight ",
             w.describe(), " need the same floating dtype");
  if (b.defined())
    LOOM_CHECK(b.dim() == 1 && b.size(0) == w.size(0) && b.dtype() == x.dtype(), op, ": bias ", b.describe(),
               " must be [", w.size(0), "] ", dtype_name(x.dtype()));
}

// x as a contiguous [M, K] matrix in the compute dtype (a view when it already is one).
Tensor rows(const Tensor& x, DType cd) { return reshape(contiguous(to(x, cd)), {-1, x.size(-1)}); }

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear("linear", x, w, b);
  const int64_t pm = x.numel() / std::max<int64_t>(1, x.size(-1)), pk = x.size(-1), pn = w.size(0);
  profile::Scope prof([&] { return "linear fwd " + profile::shape(pm, pk, pn); }, 2.0 * double(pm * pk * pn),
                      double(pm * pk + pk * pn + pm * pn) * double(element_size(x.dtype())));
  if (x.device().is_cuda()) return cuda::linear(x, w, b);  // cuBLAS (cuda/gemm.cpp)
  check_device_supported("linear", x.device());
  const DType od = operand_of(x.dtype());  // GEMM operands and output
  Tensor x2 = rows(x, od), wc = contiguous(to(w, od));
  const int64_t M = x2.size(0), K = x2.size(1), N = w.size(0);
  Tensor out = empty({M, N}, od);
  const int64_t row_grain = std::max<int64_t>(1, cpu::kElementwiseGrain / std::max<int64_t>(N, 1));
  // bf16 or K = 0: every row starts as the bias, and the GEMM adds x @ wᵀ onto it.
  const bool prefill = b.defined() && (od == kBFloat16 || K == 0);
  Tensor bc = b.defined() ? contiguous(to(b, od)) : Tensor();
  if (prefill) {
    const size_t row_bytes = size_t(N) * element_size(od);
    const char* bp = static_cast<const char*>(bc.raw_data());
    char* o = static_cast<char*>(out.raw_data());
    cpu::parallel_for(M, row_grain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) std::memcpy(o + size_t(i) * row_bytes, bp, row_bytes);
    });
  }
  if (K == 0) {
    if (!b.defined()) zero_(out);
  } else if (M > 0 && N > 0) {
    gemm(false, true, M, N, K, x2, wc, /*beta_one=*/prefill, out);
    if (b.defined() && !prefill) {  // y [M, N] += b, row by row
      LOOM_DISPATCH_COMPUTE(od, "linear", {
        const scalar_t* bp = bc.data<scalar_t>();
        scalar_t* o = out.data<scalar_t>();
        cpu::parallel_for(M, row_grain, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = 0; j < N; ++j) o[i * N + j] += bp[j];
        });
      });
    }
  }
  return reshape(to(out, x.dtype()), with_last(x.shape(), N));
}

// On the CPU: the GEMM without its bias, then one sweep adds the bias and
// applies GELU (cpu/bias_gelu.h) where linear's bias pass and gelu took two;
// the bits are those of gelu(linear(x, w, b)). bf16 (its bias goes in before
// the GEMM) and K = 0 run the two ops as they are.
LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear("linear_gelu", x, w, b);
  if (x.device().is_cuda()) return cuda::linear_gelu(x, w, b);  // one cuBLASLt call under fast kernels
  if ((x.dtype() != kFloat32 && x.dtype() != kFloat64) || x.size(-1) == 0) {
    Tensor h = linear(x, w, b);
    return {h, gelu(h)};
  }
  Tensor h = linear(x, w, Tensor());  // [..., N] = x @ wᵀ, fp32 or fp64, contiguous
  Tensor y = empty(h.shape(), h.dtype());
  const int64_t N = w.size(0), M = h.numel() / std::max<int64_t>(1, N);
  profile::Scope prof("bias_gelu fwd", double(M * N), 3.0 * double(M * N) * double(element_size(h.dtype())));
  Tensor bc = b.defined() ? contiguous(b) : Tensor();
  LOOM_DISPATCH_COMPUTE(h.dtype(), "linear_gelu", {
    cpu::bias_gelu(h.data<scalar_t>(), y.data<scalar_t>(), bc.defined() ? bc.data<scalar_t>() : nullptr, M, N);
  });
  return {h, y};
}

LinearGrads linear_backward(const Tensor& grad, const Tensor& x, const Tensor& w, bool need_x, bool need_w,
                            bool need_b) {
  check_linear("linear_backward", x, w, Tensor());
  LOOM_CHECK(grad.shape() == with_last(x.shape(), w.size(0)), "linear_backward: grad ", grad.shape(),
             " does not match input ", x.shape(), " and weight ", w.shape());
  LOOM_CHECK(grad.device() == x.device(), "linear_backward: grad on ", grad.device().str(), ", input on ",
             x.device().str());
  const int64_t pm = grad.numel() / std::max<int64_t>(1, grad.size(-1)), pn = grad.size(-1), pk = w.size(1);
  const double products = double(need_x) + double(need_w);  // dx = g @ w and dw = gᵀ @ x: 2MKN flops each
  profile::Scope prof([&] { return "linear bwd " + profile::shape(pm, pk, pn); },
                      2.0 * products * double(pm * pk * pn),  // the CPU bias sums: their own scope below
                      products * double(pm * pk + pk * pn + pm * pn) * double(element_size(x.dtype())));
  if (x.device().is_cuda()) return cuda::linear_backward(grad, x, w, need_x, need_w, need_b);
  check_device_supported("linear_backward", x.device());
  const DType od = operand_of(x.dtype());  // GEMM operands and outputs
  Tensor g2 = rows(grad, od);
  const int64_t M = g2.size(0), N = g2.size(1), K = w.size(1);
  LinearGrads r;
  if (need_x) {  // dx [M, K] = g [M, N] @ w [N, K]
    Tensor wc = contiguous(to(w, od));
    r.dx = empty({M, K}, od);
    if (N == 0) zero_(r.dx);
    else if (M > 0 && K > 0) gemm(false, false, M, K, N, g2, wc, false, r.dx);
    r.dx = reshape(to(r.dx, x.dtype()), x.shape());
  }
  if (need_w) {  // dW [N, K] = gᵀ [N, M] @ x [M, K]
    Tensor x2 = rows(x, od);
    r.dw = empty({N, K}, od);
    if (M == 0) zero_(r.dw);
    else if (N > 0 && K > 0) gemm(true, false, N, K, M, g2, x2, false, r.dw);
    r.dw = to(r.dw, w.dtype());
  }
  if (need_b) {  // db [N]: column sums of g in double, rounded once
    // Its own line in the profile: a pass over g that reads memory, not a GEMM's flops.
    profile::Scope bias_prof("linear bwd bias", double(M * N), double(M * N) * double(element_size(od)));
    Tensor acc = empty({N}, kFloat64);
    LOOM_DISPATCH_FLOAT(od, "linear_backward", { column_sums(g2.data<scalar_t>(), M, N, acc.data<double>()); });
    r.db = to(acc, x.dtype());
  }
  return r;
}

}  // namespace loom::ops
