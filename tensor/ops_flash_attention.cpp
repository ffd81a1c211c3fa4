// flash_attention and its backward: the checks, the hand-off to the CUDA
// kernels (tensor/cuda/fast/), and on the CPU the kernels' own loops run one
// thread-row at a time, in their order, over the per-tile math of
// tensor/kernels/flash_attention.h. A CUDA block of kRows threads becomes a
// loop over t < kRows; shared memory becomes the k_tile/v_tile (or q/dO
// tile) arrays; registers become each row's q, acc, m, l. Each row's sums
// then add the same terms in the same order as its GPU thread does, so the
// CPU tests (tests/test_flash_attention.cpp) check the kernels' algorithm
// (tiling, online softmax, causal masking on the diagonal tile, the
// recomputed P in backward). Rows are padded to HD = 32 or 64 with zeros.
//
// Shapes: q, k, v, o, dO [B, H, T, hd] (any strides, last dim contiguous);
// lse, D [B, H, T] in the compute dtype (float; double for float64).
#include <algorithm>
#include <climits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/parallel.h"
#include "tensor/flash_attention.h"
#include "tensor/kernels/flash_attention.h"
#include "tensor/profile.h"
#include "tensor/ops.h"
#ifdef LOOM_WITH_CUDA
#include "tensor/cuda/fast/flash_attention.h"
#include "tensor/cuda/fast/flash_attention_mma.h"
#include "tensor/cuda/kernel_choice.h"
#endif

namespace loom::ops {

namespace {

using namespace loom::kernels::flash;

Tensor rows_contiguous(const Tensor& t) { return t.stride(-1) == 1 ? t : contiguous(t); }

// A [B, H, T, hd] result stored as [B, T, H, hd]: heads merged in memory.
Tensor merged_heads(const Tensor& like) {
  const Shape& s = like.shape();
  return transpose(empty({s[0], s[2], s[1], s[3]}, like.dtype(), like.device()), 1, 2);
}

// Row t of head (b, h) of a [B, H, T, hd] tensor with a contiguous last dim.
template <class S>
struct Heads {
  S* p;
  int64_t sb, sh, st;
  explicit Heads(const Tensor& x)
      : p(static_cast<S*>(x.raw_data())), sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)) {}
  S* row(int64_t b, int64_t h, int64_t t) const { return p + b * sb + h * sh + t * st; }
  S* row_or_null(int64_t b, int64_t h, int64_t t, int64_t T) const { return t < T ? row(b, h, t) : nullptr; }
};

// dst[0..HD) <- src[0..hd) in the compute type, zeros past hd (and for rows past T).
template <int HD, class A, class S>
void load_row(A* dst, const S* src, int64_t hd, bool valid) {
  for (int d = 0; d < HD; ++d) dst[d] = valid && d < hd ? A(cpu::to_acc(src[d])) : A(0);
}

template <class S, class A>
void store_row(S* dst, const A* src, int64_t hd, A factor) {
  for (int64_t d = 0; d < hd; ++d) dst[d] = cpu::from_acc<S>(src[d] * factor);
}

struct Dims {
  int64_t B, H, T, hd;
};

// The forward kernel's loops: per query block, K/V tiles up to its last row.
template <int HD, class S, class A>
void forward_rows(const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& o_, const Tensor& lse_,
                  Dims n, A scale) {
  const Heads<S> q(q_), k(k_), v(v_), o(o_);
  A* lse = lse_.data<A>();
  cpu::parallel_for_tasks(n.B * n.H, [&](int64_t i0, int64_t i1) {
    std::vector<A> k_tile(kKeyTile * HD), v_tile(kKeyTile * HD);  // the kernel's shared memory
    std::vector<A> qr(kRows * HD), acc(kRows * HD), m(kRows), l(kRows);  // its threads' registers
    for (int64_t bh = i0; bh < i1; ++bh) {
      const int64_t b = bh / n.H, h = bh % n.H;
      for (int64_t r0 = 0; r0 < n.T; r0 += kRows) {
        const int rows = int(std::min<int64_t>(kRows, n.T - r0));
        for (int t = 0; t < rows; ++t) {
          load_row<HD>(&qr[t * HD], q.row(b, h, r0 + t), n.hd, true);
          std::fill_n(&acc[t * HD], HD, A(0));
          m[t] = A(-INFINITY);
          l[t] = A(0);
        }
        for (int64_t key0 = 0; key0 < r0 + rows; key0 += kKeyTile) {
          for (int j = 0; j < kKeyTile; ++j) {
            load_row<HD>(&k_tile[j * HD], k.row_or_null(b, h, key0 + j, n.T), n.hd, key0 + j < n.T);
            load_row<HD>(&v_tile[j * HD], v.row_or_null(b, h, key0 + j, n.T), n.hd, key0 + j < n.T);
          }
          for (int t = 0; t < rows; ++t) {
            A s[kKeyTile];
            A* acc_t = &acc[t * HD];
            score_tile<HD>(&qr[t * HD], k_tile.data(), int(key0), int(r0 + t), int(n.T), scale, s);
            online_softmax_update<HD>(s, v_tile.data(), m[t], l[t], acc_t);
          }
        }
        for (int t = 0; t < rows; ++t) {
          A* acc_t = &acc[t * HD];
          lse[bh * n.T + r0 + t] = finish_row<HD>(m[t], l[t], acc_t);
          store_row(o.row(b, h, r0 + t), acc_t, n.hd, A(1));
        }
      }
    }
  });
}

// The backward's three kernels: D = rowsum(dO * O); dK, dV per key block
// over Q/dO tiles from the block's first key on; dQ per query block over
// K/V tiles up to its last row.
template <int HD, class S, class A>
void backward_rows(const Tensor& do_, const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& o_,
                   const Tensor& lse_, const Tensor& D_, const FlashAttentionGrads& g, Dims n, A scale) {
  const Heads<S> dO(do_), q(q_), k(k_), v(v_), o(o_), dq(g.dq), dk(g.dk), dv(g.dv);
  const A* lse = lse_.data<A>();
  A* D = D_.data<A>();
  cpu::parallel_for_tasks(n.B * n.H, [&](int64_t i0, int64_t i1) {
    std::vector<A> a(kRows * HD), b_(kRows * HD), c(kRows * HD), e(kRows * HD);  // registers or shared rows
    std::vector<A> qt(kQueryTile * HD), dot_(kQueryTile * HD);                   // shared Q, dO tiles
    std::vector<A> kt(kKeyTile * HD), vt(kKeyTile * HD);                         // shared K, V tiles
    for (int64_t bh = i0; bh < i1; ++bh) {
      const int64_t b = bh / n.H, h = bh % n.H;
      for (int64_t t = 0; t < n.T; ++t) {  // D: one thread per row
        load_row<HD>(&a[0], dO.row(b, h, t), n.hd, true);
        load_row<HD>(&b_[0], o.row(b, h, t), n.hd, true);
        D[bh * n.T + t] = dot<HD, A>(&a[0], &b_[0]);
      }
      for (int64_t k0 = 0; k0 < n.T; k0 += kRows) {  // dK, dV: thread t holds key k0 + t
        const int rows = int(std::min<int64_t>(kRows, n.T - k0));
        for (int t = 0; t < rows; ++t) {
          load_row<HD>(&a[t * HD], k.row(b, h, k0 + t), n.hd, true);
          load_row<HD>(&b_[t * HD], v.row(b, h, k0 + t), n.hd, true);
        }
        std::fill(c.begin(), c.end(), A(0));  // dk
        std::fill(e.begin(), e.end(), A(0));  // dv
        for (int64_t q0 = k0; q0 < n.T; q0 += kQueryTile) {
          const int tile = int(std::min<int64_t>(kQueryTile, n.T - q0));
          for (int i = 0; i < tile; ++i) {
            load_row<HD>(&qt[i * HD], q.row(b, h, q0 + i), n.hd, true);
            load_row<HD>(&dot_[i * HD], dO.row(b, h, q0 + i), n.hd, true);
          }
          for (int i = 0; i < tile; ++i)
            for (int t = 0; t < rows; ++t) {
              A* dk_t = &c[t * HD];
              A* dv_t = &e[t * HD];
              dkdv_step<HD>(&qt[i * HD], &dot_[i * HD], lse[bh * n.T + q0 + i], D[bh * n.T + q0 + i], int(q0 + i),
                            &a[t * HD], &b_[t * HD], int(k0 + t), scale, dk_t, dv_t);
            }
        }
        for (int t = 0; t < rows; ++t) {
          store_row(dk.row(b, h, k0 + t), &c[t * HD], n.hd, scale);
          store_row(dv.row(b, h, k0 + t), &e[t * HD], n.hd, A(1));
        }
      }
      for (int64_t r0 = 0; r0 < n.T; r0 += kRows) {  // dQ: thread t holds query r0 + t
        const int rows = int(std::min<int64_t>(kRows, n.T - r0));
        for (int t = 0; t < rows; ++t) {
          load_row<HD>(&a[t * HD], q.row(b, h, r0 + t), n.hd, true);
          load_row<HD>(&b_[t * HD], dO.row(b, h, r0 + t), n.hd, true);
        }
        std::fill(c.begin(), c.end(), A(0));  // dq
        for (int64_t key0 = 0; key0 < r0 + rows; key0 += kKeyTile) {
          for (int j = 0; j < kKeyTile; ++j) {
            load_row<HD>(&kt[j * HD], k.row_or_null(b, h, key0 + j, n.T), n.hd, key0 + j < n.T);
            load_row<HD>(&vt[j * HD], v.row_or_null(b, h, key0 + j, n.T), n.hd, key0 + j < n.T);
          }
          for (int j = 0; j < kKeyTile && key0 + j < n.T; ++j)
            for (int t = 0; t < rows; ++t) {
              A* dq_t = &c[t * HD];
              dq_step<HD>(&a[t * HD], &b_[t * HD], lse[bh * n.T + r0 + t], D[bh * n.T + r0 + t], int(r0 + t),
                          &kt[j * HD], &vt[j * HD], int(key0 + j), scale, dq_t);
            }
        }
        for (int t = 0; t < rows; ++t) store_row(dq.row(b, h, r0 + t), &c[t * HD], n.hd, scale);
      }
    }
  });
}

Dims dims_of(const Tensor& q) { return {q.size(0), q.size(1), q.size(2), q.size(3)}; }

DType lse_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// The tensor-core kernels (tensor/cuda/fast/flash_attention_mma.h) run these
// inputs: CUDA, LOOM_CUDA_KERNELS=fast, bf16/fp16, head size 64 or 128.
bool on_tensor_cores([[maybe_unused]] const Tensor& q, [[maybe_unused]] const Tensor& k,
                     [[maybe_unused]] const Tensor& v) {
#ifdef LOOM_WITH_CUDA
  return q.device().is_cuda() && cuda::fast_kernels() && cuda::flash_attention_mma_unsupported(q, k, v).empty();
#else
  return false;  // a build without CUDA has no GPU tensors
#endif
}

}  // namespace

std::string flash_attention_unsupported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.dim() != 4 || k.shape() != q.shape() || v.shape() != q.shape())
    return str("q, k, v must be [B, H, T, hd] of one shape, got ", q.shape(), ", ", k.shape(), ", ", v.shape());
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || k.device() != q.device() || v.device() != q.device())
    return str("q, k, v differ in dtype or device: ", q.describe(), " on ", q.device().str(), ", ", k.describe(),
               " on ", k.device().str(), ", ", v.describe(), " on ", v.device().str());
  const bool cuda = q.device().is_cuda();
  if (!is_floating(q.dtype()) || (cuda && q.dtype() == kFloat64))
    return str("dtype ", dtype_name(q.dtype()), " (float32, bfloat16, float16", cuda ? "" : ", float64", " only)");
  if (q.size(3) < 1 || (q.size(3) > kMaxHeadDim && !on_tensor_cores(q, k, v)))
    return str("head size ", q.size(3), " (1 to ", kMaxHeadDim,
               ": the kernels keep rows in registers; 128 on the tensor cores: bf16/fp16 on a GPU with "
               "LOOM_CUDA_KERNELS=fast)");
  if (q.size(2) > INT_MAX / 2) return str("sequence length ", q.size(2), " is too long");
  return "";
}

FlashAttentionResult flash_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale) {
  profile::Scope prof("flash attention fwd", 4.0 * double(q_in.numel()) * double(q_in.dim() == 4 ? q_in.size(2) : 0),
                      double(4 * q_in.numel()) * double(element_size(q_in.dtype())));
  const std::string why = flash_attention_unsupported(q_in, k_in, v_in);
  LOOM_CHECK(why.empty(), "flash_attention: ", why);
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
#ifdef LOOM_WITH_CUDA
  if (q.device().is_cuda()) {
    // The tensor-core forward where it takes the inputs and the fast kernels
    // are chosen; the CUDA-core kernel (the reference) otherwise.
    if (on_tensor_cores(q, k, v)) return cuda::flash_attention_mma(q, k, v, scale);
    return cuda::flash_attention(q, k, v, scale);
  }
#endif
  const Dims n = dims_of(q);
  FlashAttentionResult r{merged_heads(q), empty({n.B, n.H, n.T}, lse_dtype(q.dtype()))};
  LOOM_DISPATCH_FLOAT(q.dtype(), "flash_attention", {
    if (n.hd <= 32) forward_rows<32, scalar_t, acc_t>(q, k, v, r.o, r.lse, n, acc_t(scale));
    else forward_rows<64, scalar_t, acc_t>(q, k, v, r.o, r.lse, n, acc_t(scale));
  });
  return r;
}

FlashAttentionGrads flash_attention_backward(const Tensor& grad_o, const Tensor& q_in, const Tensor& k_in,
                                             const Tensor& v_in, const Tensor& o_in, const Tensor& lse, double scale) {
  profile::Scope prof("flash attention bwd", 8.0 * double(q_in.numel()) * double(q_in.dim() == 4 ? q_in.size(2) : 0),
                      double(8 * q_in.numel()) * double(element_size(q_in.dtype())));
  const std::string why = flash_attention_unsupported(q_in, k_in, v_in);
  LOOM_CHECK(why.empty(), "flash_attention_backward: ", why);
  LOOM_CHECK(grad_o.shape() == q_in.shape() && grad_o.dtype() == q_in.dtype() && o_in.shape() == q_in.shape() &&
                 o_in.dtype() == q_in.dtype() && grad_o.device() == q_in.device() && o_in.device() == q_in.device(),
             "flash_attention_backward: grad ", grad_o.describe(), " and o ", o_in.describe(), " must match q ",
             q_in.describe(), " on ", q_in.device().str());
  const Dims n = dims_of(q_in);
  LOOM_CHECK(lse.shape() == Shape({n.B, n.H, n.T}) && lse.dtype() == lse_dtype(q_in.dtype()) &&
                 lse.device() == q_in.device() && lse.is_contiguous(),
             "flash_attention_backward: lse ", lse.describe(), " is not the forward's [B, H, T] for q ",
             q_in.describe());
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const Tensor dO = rows_contiguous(grad_o), o = rows_contiguous(o_in);
#ifdef LOOM_WITH_CUDA
  if (q.device().is_cuda()) {  // as forward: the tensor cores where they take the inputs
    if (on_tensor_cores(q, k, v)) return cuda::flash_attention_mma_backward(dO, q, k, v, o, lse, scale);
    return cuda::flash_attention_backward(dO, q, k, v, o, lse, scale);
  }
#endif
  FlashAttentionGrads g{merged_heads(q), merged_heads(q), merged_heads(q)};
  Tensor D = empty({n.B, n.H, n.T}, lse.dtype());
  LOOM_DISPATCH_FLOAT(q.dtype(), "flash_attention_backward", {
    if (n.hd <= 32) backward_rows<32, scalar_t, acc_t>(dO, q, k, v, o, lse, D, g, n, acc_t(scale));
    else backward_rows<64, scalar_t, acc_t>(dO, q, k, v, o, lse, D, g, n, acc_t(scale));
  });
  return g;
}

}  // namespace loom::ops
