// lt_plan and the cache key (gemm_lt_plan.h). Plain C++, in every build.
#include "tensor/cuda/fast/gemm_lt_plan.h"

#include <functional>

#include "tensor/error.h"

namespace loom::cuda::fast {

bool LtPlan::operator==(const LtPlan& o) const {
  auto same = [](const LtLayout& x, const LtLayout& y) {
    return x.rows == y.rows && x.cols == y.cols && x.ld == y.ld && x.batch_stride == y.batch_stride;
  };
  return device == o.device && dtype == o.dtype && trans_a == o.trans_a && trans_b == o.trans_b && m == o.m &&
         n == o.n && k == o.k && batch == o.batch && same(a, o.a) && same(b, o.b) && same(d, o.d) &&
         epilogue == o.epilogue && bias_len == o.bias_len && aux_ld == o.aux_ld && align == o.align &&
         beta_one == o.beta_one;
}

size_t LtPlanHash::operator()(const LtPlan& p) const {
  size_t h = 0;
  auto mix = [&h](int64_t v) { h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  for (int64_t v : {int64_t(p.device), int64_t(p.dtype), int64_t(p.trans_a), int64_t(p.trans_b), p.m, p.n, p.k,
                    p.batch, p.a.ld, p.b.ld, p.d.ld, p.a.batch_stride, p.b.batch_stride, p.d.batch_stride,
                    int64_t(p.epilogue), p.aux_ld, int64_t(p.align), int64_t(p.beta_one)})
    mix(v);
  return h;
}

int common_alignment(std::initializer_list<uint64_t> bytes) {
  int align = 16;
  for (uint64_t v : bytes)
    while (v % uint64_t(align) != 0) align /= 2;
  return align;
}

Gemm linear_gemm(int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* out) {
  Gemm g;
  g.tb = true, g.M = M, g.N = N, g.K = K;
  g.a = x, g.lda = K, g.b = w, g.ldb = K, g.c = out, g.ldc = N;
  return g;
}

Gemm linear_dx_gemm(int64_t M, int64_t N, int64_t K, const void* g, const void* w, void* dx) {
  Gemm r;
  r.M = M, r.N = K, r.K = N;
  r.a = g, r.lda = N, r.b = w, r.ldb = K, r.c = dx, r.ldc = K;
  return r;
}

Gemm linear_dw_gemm(int64_t M, int64_t N, int64_t K, const void* g, const void* x, void* dw) {
  Gemm r;
  r.ta = true, r.M = N, r.N = K, r.K = M;
  r.a = g, r.lda = N, r.b = x, r.ldb = K, r.c = dw, r.ldc = K;
  return r;
}

LtPlan lt_plan(const Device& dev, DType t, const Gemm& g, LtEpilogue e, const void* bias, const void* aux) {
  const bool gelu = is_gelu(e), needs_bias = e != LtEpilogue::None && e != LtEpilogue::GeluAux;
  LOOM_CHECK(g.batch == 1 || e == LtEpilogue::None, "cuBLASLt GEMM: an epilogue needs a single matrix (batch ",
             g.batch, ")");
  static const char* const names[] = {"none", "BIAS", "BGRADB", "GELU_AUX", "GELU_AUX_BIAS"};
  LOOM_CHECK(needs_bias == (bias != nullptr) && gelu == (aux != nullptr), "cuBLASLt GEMM: epilogue ",
             names[int(e)], " given ", bias ? "a" : "no", " bias vector and ", aux ? "an" : "no", " aux matrix");
  LOOM_CHECK(!gelu || (gelu_aux_fits(g.ldc) && g.beta == 0), "cuBLASLt GEMM: the GELU epilogue's aux matrix takes ",
             "D's leading dimension ", g.ldc, ", which must be a multiple of 8, and beta 0 (got ", g.beta, ")");
  const uint64_t es = element_size(t);
  LtPlan p;
  p.device = dev.index;
  p.dtype = t;
  p.trans_a = g.tb, p.trans_b = g.ta;  // the operands swap places, the op flags do not
  p.m = g.N, p.n = g.M, p.k = g.K, p.batch = g.batch;
  p.a = {p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, g.ldb, g.stride_b};
  p.b = {p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, g.lda, g.stride_a};
  p.d = {p.m, p.n, g.ldc, g.stride_c};
  p.epilogue = e;
  p.bias_len = e == LtEpilogue::Bias || e == LtEpilogue::GeluAuxBias ? p.m : e == LtEpilogue::BGradB ? p.n : 0;
  p.aux_ld = gelu ? g.ldc : 0;
  p.beta_one = g.beta != 0;
  p.align = common_alignment({uint64_t(reinterpret_cast<uintptr_t>(g.a)), uint64_t(reinterpret_cast<uintptr_t>(g.b)),
                              uint64_t(reinterpret_cast<uintptr_t>(g.c)), uint64_t(reinterpret_cast<uintptr_t>(bias)),
                              uint64_t(reinterpret_cast<uintptr_t>(aux)),
                              uint64_t(g.stride_a) * es, uint64_t(g.stride_b) * es, uint64_t(g.stride_c) * es});
  return p;
}

}  // namespace loom::cuda::fast
