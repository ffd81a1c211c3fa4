// The per-row ops Llama adds to GPT-2's: rms_norm (RMSNorm) and rope (rotary
// position embeddings). As ops_nn.cpp's: the rows in the compute type (float64
// stays double, everything else fp32, rounded back to the input dtype), the
// math in tensor/kernels/rmsnorm.h and rope.h, which cuda/rows.cu calls too.
#include <algorithm>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/rows.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/rmsnorm.h"
#include "tensor/kernels/rope.h"
#include "tensor/ops.h"

namespace loom::ops {

namespace {

int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }
int64_t column_grain(int64_t rows) { return std::max<int64_t>(16, 16384 / std::max<int64_t>(rows, 1)); }

}  // namespace

RMSNormResult rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  LOOM_CHECK(x.dim() >= 1, "rms_norm: expected at least 1 dim, got a scalar");
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  if (weight.defined()) {
    LOOM_CHECK(weight.dim() == 1 && weight.size(0) == C && weight.dtype() == x.dtype(), "rms_norm: input ",
               x.describe(), " needs a weight of shape [", C, "] and the same dtype, got ", weight.describe());
    LOOM_CHECK(weight.device() == x.device(), "rms_norm: input on ", x.device().str(), ", weight on ",
               weight.device().str());
  }
  if (x.device().is_cuda()) return cuda::rms_norm(x, weight, eps);
  Tensor xc = cpu::rows_of("rms_norm", x);
  const DType cd = xc.dtype();
  Tensor w = weight.defined() ? contiguous(to(weight, cd)) : Tensor();
  Tensor y = empty(xc.shape(), cd), rstd = empty({rows}, cd);
  LOOM_DISPATCH_COMPUTE(cd, "rms_norm", {
    {
      const scalar_t* wp = w.defined() ? w.data<scalar_t>() : nullptr;
      const scalar_t* xp = xc.data<scalar_t>();
      scalar_t *yp = y.data<scalar_t>(), *rp = rstd.data<scalar_t>();
      cpu::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) kernels::rmsnorm_row(xp + r * C, wp, yp + r * C, long(C), scalar_t(eps), rp + r);
      });
    }
  });
  return {to(y, x.dtype()), rstd};
}

RMSNormGrads rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  if (x.device().is_cuda()) return cuda::rms_norm_backward(grad, x, weight, rstd);
  Tensor gc = cpu::rows_of("rms_norm_backward", grad), xc = cpu::rows_of("rms_norm_backward", x);
  const DType cd = xc.dtype();
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  Tensor w = weight.defined() ? contiguous(to(weight, cd)) : Tensor();
  Tensor dx = empty(xc.shape(), cd), dw = zeros({C}, cd);
  LOOM_DISPATCH_COMPUTE(cd, "rms_norm_backward", {
    {
      const scalar_t* wp = w.defined() ? w.data<scalar_t>() : nullptr;
      const scalar_t *gp = gc.data<scalar_t>(), *xp = xc.data<scalar_t>(), *rp = rstd.data<scalar_t>();
      scalar_t *dxp = dx.data<scalar_t>(), *dwp = dw.data<scalar_t>();
      // dx row by row; dw column by column, each column summing the rows in
      // row order (the same bits on any number of threads), as layer_norm_backward.
      cpu::parallel_for(rows, row_grain(C), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          kernels::rmsnorm_backward_row(gp + r * C, xp + r * C, wp, rp[r], dxp + r * C,
                                        static_cast<scalar_t*>(nullptr), long(C));
      });
      cpu::parallel_for(C, column_grain(rows), [&](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < rows; ++r)
          kernels::rmsnorm_weight_grad_row(gp + r * C, xp + r * C, rp[r], dwp, long(c0), long(c1));
      });
    }
  });
  const DType wd = weight.defined() ? weight.dtype() : x.dtype();
  return {to(dx, x.dtype()), to(dw, wd)};
}

Tensor rope(const Tensor& x, double base, int64_t pos0, bool inverse) {
  LOOM_CHECK(x.dim() >= 2 && x.size(-1) % 2 == 0, "rope: needs [..., T, hd] with an even head size hd, got ",
             x.shape());
  LOOM_CHECK(base > 1.0 && pos0 >= 0, "rope: base must be > 1 and the first position >= 0, got base ", base,
             ", pos0 ", pos0);
  const int64_t T = x.size(-2), hd = x.size(-1), h = hd / 2;
  const DType cd = cpu::compute_dtype(x.dtype());
  // The angles of the T positions, once per call: cos, sin [T, hd/2].
  Tensor cos = empty({T, h}, cd), sin = empty({T, h}, cd);
  LOOM_DISPATCH_COMPUTE(cd, "rope", {
    scalar_t *cp = cos.data<scalar_t>(), *sp = sin.data<scalar_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < h; ++i) {
        const double a = kernels::rope_angle(long(pos0 + t), long(i), long(hd), base);
        cp[t * h + i] = scalar_t(std::cos(a));
        sp[t * h + i] = scalar_t(std::sin(a));
      }
  });
  if (x.device().is_cuda()) return cuda::rope(x, to(cos, x.device()), to(sin, x.device()), inverse);
  Tensor xc = cpu::rows_of("rope", x);
  Tensor y = empty(xc.shape(), cd);
  const int64_t rows = x.numel() / hd;
  LOOM_DISPATCH_COMPUTE(cd, "rope", {
    {
      const scalar_t *xp = xc.data<scalar_t>(), *cp = cos.data<scalar_t>(), *sp = sin.data<scalar_t>();
      scalar_t* yp = y.data<scalar_t>();
      const scalar_t sign = inverse ? scalar_t(-1) : scalar_t(1);
      cpu::parallel_for(rows, row_grain(hd), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t t = r % T;  // row r of [rows, hd] is position t of its [T, hd] block
          kernels::rope_row(xp + r * hd, yp + r * hd, long(hd), cp + t * h, sp + t * h, sign);
        }
      });
    }
  });
  return to(y, x.dtype());
}

}  // namespace loom::ops
