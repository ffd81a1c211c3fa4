// cuBLASLt GEMMs with epilogues (gemm_lt.h); the plan and cache key are
// gemm_lt_plan.cpp's. Host code: plain C++ with the host flags, like gemm.cpp.
#include "tensor/cuda/fast/gemm_lt.h"

#include <cublasLt.h>

#include <atomic>
#include <climits>
#include <mutex>
#include <unordered_map>

#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/cuda_ops.h"

namespace loom::cuda::fast {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what NVIDIA suggests for Hopper

// One plan's descriptors and algorithm; found == false: the heuristic had none (cuBLAS instead).
struct LtEntry {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;
};

struct DeviceLt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// Held from the lookup to the enqueue: the bias pointer is set on the shared
// descriptor. Everything lives as long as the process (like context.cpp's handles).
std::mutex g_mutex;
std::unordered_map<int, DeviceLt> g_devices;
std::unordered_map<LtPlan, LtEntry, LtPlanHash> g_cache;
std::atomic<int64_t> g_lt{0}, g_fallback{0};

cudaDataType_t cuda_type(DType t) { return t == kBFloat16 ? CUDA_R_16BF : CUDA_R_16F; }

DeviceLt& device_lt(int index) {  // under g_mutex, the device current
  auto it = g_devices.find(index);
  if (it != g_devices.end()) return it->second;
  DeviceLt s;  // kept only once both exist (a failed cudaMalloc throws and is retried next call)
  CUBLAS_CHECK(cublasLtCreate(&s.handle));
  CUDA_CHECK(cudaMalloc(&s.workspace, kWorkspaceBytes));
  return g_devices.emplace(index, s).first->second;
}

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::BGradB: return CUBLASLT_EPILOGUE_BGRADB;
    case LtEpilogue::GeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

template <class T>
void set_desc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& v) {
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof v));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t ty, const LtLayout& l, int64_t batch) {
  cublasLtMatrixLayout_t h = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, ty, uint64_t(l.rows), uint64_t(l.cols), l.ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &l.batch_stride,
                                                  sizeof l.batch_stride));
  }
  return h;
}

// p's descriptors and the heuristic's first algorithm, made on p's first use.
LtEntry& entry(cublasLtHandle_t h, const LtPlan& p, const void* bias, const void* aux) {
  auto it = g_cache.find(p);
  if (it != g_cache.end()) return it->second;
  LtEntry e;
  const cudaDataType_t ty = cuda_type(p.dtype);
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&e.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // fp32 accumulation and scalars
  set_desc(e.op, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(e.op, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(lt_epilogue(p.epilogue)));
  // The vector in the operands' dtype; its address tells the heuristic its alignment.
  if (bias) {
    set_desc(e.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(ty));
    set_desc(e.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  // GELU's input h, in D's dtype (the aux type's default for GELU) and layout; the address as for the bias.
  if (aux) {
    set_desc(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    set_desc(e.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
  }
  e.a = make_layout(ty, p.a, p.batch);
  e.b = make_layout(ty, p.b, p.batch);
  e.d = make_layout(ty, p.d, p.batch);
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align = uint32_t(p.align);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align));
  cublasLtMatmulHeuristicResult_t r{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, e.op, e.a, e.b, e.d, e.d, pref, 1, &r, &count);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);  // not supported: no algorithm, cuBLAS instead
  e.found = st == CUBLAS_STATUS_SUCCESS && count > 0;
  if (e.found) e.algo = r.algo;
  return g_cache.emplace(p, e).first->second;
}

// g on cuBLASLt with epilogue e (bias: its vector; aux: GELU's h); false,
// having run nothing, when the heuristic has no algorithm for it.
bool lt_matmul(const Device& d, DType t, const Gemm& g, LtEpilogue e, const void* bias, void* aux = nullptr) {
  LOOM_CHECK(g.batch < INT_MAX, "matmul: ", g.batch, " products exceed cuBLASLt's 32-bit batch count");
  const LtPlan p = lt_plan(d, t, g, e, bias, aux);
  DeviceGuard guard(d);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceLt& s = device_lt(d.index);
  LtEntry& en = entry(s.handle, p, bias, aux);
  if (!en.found) {
    g_fallback.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (bias) set_desc(en.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (aux) set_desc(en.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(aux));
  const float alpha = 1, beta = p.beta_one ? 1.0f : 0.0f;
  count_launch();  // one cuBLASLt call (launch_count.h), epilogue included
  // cuBLASLt's A is loom's b, its B loom's a (gemm_lt_plan.h); C and D are loom's c.
  CUBLAS_CHECK(cublasLtMatmul(s.handle, en.op, &alpha, g.b, en.a, g.a, en.b, &beta, g.c, en.d, g.c, en.d, &en.algo,
                              s.workspace, kWorkspaceBytes, stream(d)));
  g_lt.fetch_add(1, std::memory_order_relaxed);
  return true;
}

Shape with_last(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

}  // namespace

void gemm(const Device& d, DType t, const Gemm& g) {
  if (!lt_matmul(d, t, g, LtEpilogue::None, nullptr)) cublas_gemm(d, t, g);
}

// x: [..., K], w: [N, K], b: [N] or undefined, all of x's dtype -> [..., N]
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const DType t = x.dtype();
  Tensor x2 = ops::reshape(ops::contiguous(x), {-1, x.size(-1)}), wc = ops::contiguous(w);
  Tensor bc = b.defined() ? ops::contiguous(b) : Tensor();
  const int64_t M = x2.size(0), K = x2.size(1), N = w.size(0);
  Tensor out = empty({M, N}, t, x.device());
  if (K == 0 || M == 0 || N == 0) {  // no products: the bias alone, or zeros
    if (b.defined()) ops::copy_(out, bc);
    else ops::zero_(out);
  } else {
    Gemm g = linear_gemm(M, N, K, x2.raw_data(), wc.raw_data(), out.raw_data());  // (+ b in the epilogue)
    if (!b.defined()) {
      gemm(x.device(), t, g);
    } else if (!lt_matmul(x.device(), t, g, forward_epilogue(true), bc.raw_data())) {
      ops::copy_(out, bc);  // no algorithm with BIAS: unfused, as the reference (every row starts as the bias)
      g.beta = 1;
      gemm(x.device(), t, g);
    }
  }
  return ops::reshape(out, with_last(x.shape(), N));
}

// x: [..., K], w: [N, K], b: [N] or undefined -> h = x wᵀ + b and y = gelu(h), both [..., N]
ops::LinearGeluResult linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t K = x.size(-1), N = w.size(0), M = K > 0 ? x.numel() / K : 0;
  if (M > 0 && K > 0 && N > 0 && gelu_aux_fits(N)) {
    Tensor x2 = ops::reshape(ops::contiguous(x), {M, K}), wc = ops::contiguous(w);
    Tensor bc = b.defined() ? ops::contiguous(b) : Tensor();
    Tensor h = empty({M, N}, x.dtype(), x.device()), y = empty({M, N}, x.dtype(), x.device());
    const Gemm g = linear_gemm(M, N, K, x2.raw_data(), wc.raw_data(), y.raw_data());  // D = y, aux = h
    if (lt_matmul(x.device(), x.dtype(), g, gelu_epilogue(b.defined()), b.defined() ? bc.raw_data() : nullptr,
                  h.raw_data()))
      return {ops::reshape(h, with_last(x.shape(), N)), ops::reshape(y, with_last(x.shape(), N))};
  }
  // An empty product, a width aux cannot take, or no algorithm: the two ops (BIAS epilogue, then the gelu kernel).
  Tensor h = linear(x, w, b);
  return {h, ops::gelu(h)};
}

ops::LinearGrads linear_backward(const Tensor& grad, const Tensor& x, const Tensor& w, bool need_x, bool need_w,
                                 bool need_b) {
  const DType t = x.dtype();
  Tensor g2 = ops::reshape(ops::contiguous(grad), {-1, grad.size(-1)});
  const int64_t M = g2.size(0), N = g2.size(1), K = w.size(1);
  ops::LinearGrads r;
  if (need_x) {  // dx [M, K] = g [M, N] @ w [N, K]
    Tensor wc = ops::contiguous(w);
    r.dx = empty({M, K}, t, x.device());
    if (N == 0) {
      ops::zero_(r.dx);
    } else if (M > 0 && K > 0) {
      gemm(x.device(), t, linear_dx_gemm(M, N, K, g2.raw_data(), wc.raw_data(), r.dx.raw_data()));
    }
    r.dx = ops::reshape(r.dx, x.shape());
  }
  bool db_done = false;
  if (need_w) {  // dW [N, K] = gᵀ [N, M] @ x [M, K]; db [N] = Σ_M g in the same call (BGRADB)
    Tensor x2 = ops::reshape(ops::contiguous(x), {-1, K});
    r.dw = empty({N, K}, t, x.device());
    if (M == 0) {
      ops::zero_(r.dw);
    } else if (N > 0 && K > 0) {
      if (need_b) r.db = empty({N}, t, x.device());
      const Gemm g = linear_dw_gemm(M, N, K, g2.raw_data(), x2.raw_data(), r.dw.raw_data());
      // no db wanted, or no algorithm with BGRADB: the GEMM alone (db below)
      if (need_b && lt_matmul(x.device(), t, g, weight_grad_epilogue(need_b), r.db.raw_data())) db_done = true;
      else gemm(x.device(), t, g);
    }
  }
  if (need_b && !db_done)  // db [N] = column sums of g in double, rounded once (the reference's)
    r.db = ops::to(ops::reshape(sum_in_double(g2, {true, false}), {N}), t);
  return r;
}

LtCounts lt_counts() { return {g_lt.load(std::memory_order_relaxed), g_fallback.load(std::memory_order_relaxed)}; }

}  // namespace loom::cuda::fast
