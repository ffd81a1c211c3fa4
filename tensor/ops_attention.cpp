// Causal attention of one layer as one op, on the CPU, skipping the masked
// blocks: the fast twin of the readable composition in nn/attention.h,
//   att = causal_softmax(q @ kᵀ, scale);  y = att @ v,
// which stays the reference this op is tested against (tests/test_attention.cpp)
// and what runs on a GPU, in bf16/fp16 and with attention dropout.
//
// The trick (FlashAttention's causal block skipping, without its online
// softmax): query rows t in a block [r0, r1) see keys 0..t only, so the block's
// scores need keys [0, r1) and nothing past them. The composition multiplies
// the whole [T, T] score matrix (half of it masked) and then multiplies the
// zeros of att by v; here each block of 64 query rows makes
//   S = q[r0:r1] @ k[0:r1]ᵀ          [m, r1]   (m = r1 - r0)
//   P = causal_softmax(S) rows        (zeros written past the diagonal)
//   y[r0:r1] = P[:, 0:r1] @ v[0:r1]   [m, hd]
// For T = 256 that is 10 of the 16 blocks of 64 x 64 the full product has
// (sum over blocks b of b + 1, of n^2; -> 1/2 as T grows): the medium GPT
// step (bench/gpt_step.sh) ran ~8% faster. For T <= 64 it is one block.
// In fp32 the products run on tensor/cpu/small_gemm.h, which also skips the
// zeros inside a block by tiles of rows (P and dS past the diagonal; scores
// past it are not computed). The small GPT's 64 x 64 x 32 blocks ran on
// oneDNN's sgemm at 44-59% of the FMA ceiling; on this kernel the step's
// attention takes ~1.1-1.5 ms less (bench/README.md). The softmax rows run
// on tensor/cpu/causal_softmax_rows.h (a block's rows phase by phase in AVX
// registers). One more saving: y is written straight into [B, T, H, hd]
// (heads merged), so the reshape that follows is a view, not a copy; dq, dk,
// dv likewise, side by side in one [B, T, 3, H, hd] buffer, so their reshapes
// in backward are views too, and so is the gradient of qkv they make up (no
// copy: packed_grads below). And while a thread computes head i, it
// prefetches head i + 1's operands and outputs into L2 (tensor/cpu/prefetch.h;
// small heads only): in the step, where q, k, v and P are not in cache, ~1 ms
// of the small GPT's ~6 ms of attention at AVX2.
// Larger heads (the medium GPT's 720 KB) fetch the next block's rows instead,
// and the next head's whole k, v (and dk, dv) a block ahead: the medium step's
// attention at AVX2 ~66-88 -> ~59-80 ms (bench/README.md, issue 47).
//
// Backward, per block, in reverse order so the last block (which sees every
// key) starts dk and dv and the earlier ones add onto their first r1 rows:
//   dP = dy[r0:r1] @ v[0:r1]ᵀ;  dS = causal_softmax_backward(dP, P)  (scale inside)
//   dv[0:r1] += P[:, 0:r1]ᵀ @ dy[r0:r1];  dq[r0:r1] = dS @ k[0:r1];  dk[0:r1] += dSᵀ @ q[r0:r1]
//
// Numbers: each score is the same hd-long dot product, each softmax row the
// kernel's bits (its backward rows within their rounding); y's sums skip only
// exact zeros, so the result agrees with the composition to rounding (its
// GEMMs may order sums differently). Threads take whole (batch, head)
// products, so any --threads gives the same bits.
#include <algorithm>
#include <vector>

#include "tensor/cpu/causal_softmax_rows.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cpu/prefetch.h"
#include "tensor/cpu/small_gemm.h"
#include "tensor/profile.h"
#include "tensor/ops.h"

namespace loom::ops {

namespace {

constexpr int64_t kBlock = 64;  // query rows per block; a multiple of 16 (causal_softmax_row works in 16s)
static_assert(kBlock % 16 == 0);

// One [T, hd] matrix of a [B, H, T, hd] tensor, rows `ld` elements apart.
template <class T>
struct Mat {
  T* p;
  int64_t ld;
};

template <class T>
Mat<T> head(const Tensor& t, int64_t b, int64_t h) {
  return {const_cast<T*>(t.data<T>()) + b * t.stride(0) + h * t.stride(1), t.stride(2)};
}

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  LOOM_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), op,
             ": q, k, v must be [B, H, T, hd] of one shape, got ", q.shape(), ", ", k.shape(), ", ", v.shape());
  LOOM_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype() && (q.dtype() == kFloat32 || q.dtype() == kFloat64),
             op, ": q, k, v must be float32 or float64 alike, got ", q.describe(), ", ", k.describe(), ", ",
             v.describe(), " (bf16/fp16 attention runs the composition in nn/attention.h)");
  LOOM_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), op,
             ": CPU only (on a GPU attention runs the composition in nn/attention.h), got q on ", q.device().str());
}

// Whether a thread fetches the next head's operands and outputs (backward: q, k, v, dy, P, dq, dk, dv)
// into L2 while it computes this head (tensor/cpu/prefetch.h): only when they are small beside L2 (512 KB
// on Zen 3, 1-2 MB since): the small GPT's head (T 64, hd 32) is 72 KB; the medium one's (T 256, hd 64)
// 720 KB is not fetched.
template <class S>
bool prefetch_next_head(int64_t T, int64_t hd) {
  return (7 * T * hd + T * T) * int64_t(sizeof(S)) <= 256 * 1024;
}

// Head i's rows of a [B, H, T, hd] tensor (rows contiguous) into L2.
template <class S>
void prefetch_head(const Tensor& t, int64_t i) {
  const Mat<S> m = head<S>(t, i / t.size(1), i % t.size(1));
  cpu::prefetch_rows(m.p, m.ld, t.size(2), t.size(3));
}

// Rows [r0, r1) of head i's [T, hd] matrix of a [B, H, T, hd] tensor into L2 (r1 clamped to T).
template <class S, bool kWrite = false>
void prefetch_head_rows(const Tensor& t, int64_t i, int64_t r0, int64_t r1) {
  const Mat<S> m = head<S>(t, i / t.size(1), i % t.size(1));
  r1 = std::min(r1, t.size(2));
  if (r0 < r1) cpu::prefetch_rows<kWrite>(m.p + r0 * m.ld, m.ld, r1 - r0, t.size(3));
}

// Inner dim contiguous, as the GEMMs need (a [B, T, H, hd] view of qkv is).
Tensor rows_contiguous(const Tensor& t) { return t.stride(-1) == 1 ? t : contiguous(t); }

// A [B, H, T, hd] result stored as [B, T, H, hd]: heads merged in memory.
Tensor merged_heads(const Tensor& like) {
  const Shape& s = like.shape();
  return transpose(empty({s[0], s[2], s[1], s[3]}, like.dtype()), 1, 2);
}

// dq, dk, dv [B, H, T, hd] stored as one [B, T, 3, H, hd] buffer: heads merged, and the three side by side
// as c_attn's output qkv [B, T, 3C] holds q, k and v. split's backward then finds them neighbours and hands
// the buffer on as qkv's gradient (ops::cat_view) instead of copying three [B, T, C] into one (the medium
// GPT step's ~4.5 ms at AVX2, issue 47). Any other layout downstream (RoPE, grouped kv heads) copies as before.
CausalAttentionGrads packed_grads(const Tensor& like) {
  const Shape& s = like.shape();
  Tensor buf = empty({s[0], s[2], 3, s[1], s[3]}, like.dtype());
  auto part = [&](int64_t j) {  // [B, T, 1, H, hd] -> [B, T, H, hd] -> [B, H, T, hd]
    return transpose(squeeze(narrow(buf, 2, j, 1), 2), 1, 2);
  };
  return {part(0), part(1), part(2)};
}

}  // namespace

CausalAttentionResult causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale) {
  // flops: QKᵀ and PV over the full T x T (as PyTorch's flop counter counts attention)
  profile::Scope prof("attention fwd", 4.0 * double(q_in.numel()) * double(q_in.dim() == 4 ? q_in.size(2) : 0),
                      double(4 * q_in.numel()) * double(element_size(q_in.dtype())));
  check_qkv("causal_attention", q_in, k_in, v_in);
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  LOOM_CHECK(hd > 0, "causal_attention: head size 0 in ", q.shape());
  CausalAttentionResult r{merged_heads(q), empty({B, H, T, T}, q.dtype())};
  LOOM_DISPATCH_COMPUTE(q.dtype(), "causal_attention", {
    using S = scalar_t;
    const bool prefetch = prefetch_next_head<S>(T, hd);
    cpu::parallel_for_tasks(B * H, [&](int64_t i0, int64_t i1) {
      std::vector<S> kt(size_t(hd * T));  // kᵀ [hd, T] of one head
      // Heads too large for that (the medium GPT's, 720 KB): the next block's rows instead, while this block
      // computes: q, the keys' v rows it newly sees, P and y (to be written); after a head's last block, head
      // i + 1's k (its transpose comes first) and its first block's rows.
      auto next_block = [&](int64_t i, int64_t r1) {
        if (prefetch) return;
        if (r1 >= T && i + 1 >= i1) return;
        const int64_t n = r1 < T ? i : i + 1, n0 = r1 < T ? r1 : 0, n1 = n0 + kBlock;
        if (n != i) prefetch_head<S>(k, n);
        prefetch_head_rows<S>(q, n, n0, n1);
        prefetch_head_rows<S>(v, n, n0, n1);
        cpu::prefetch_rows<true>(r.att.data<S>() + n * T * T + n0 * T, T, std::min(n1, T) - n0, T);
        prefetch_head_rows<S, true>(r.y, n, n0, n1);
      };
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / H, h = i % H;
        const Mat<S> qm = head<S>(q, b, h), km = head<S>(k, b, h), vm = head<S>(v, b, h), ym = head<S>(r.y, b, h);
        S* p = r.att.data<S>() + i * T * T;
        // Head i + 1's rows of t into L2, one operand per stage of this head, in the order head i + 1 reads them.
        const bool next = prefetch && i + 1 < i1;
        auto ahead = [&](const Tensor& t) {
          if (next) prefetch_head<S>(t, i + 1);
        };
        cpu::transpose_into(km.p, km.ld, T, hd, kt.data(), T);  // kt [hd, T]
        for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
          const int64_t r1 = std::min(T, r0 + kBlock), m = r1 - r0;
          if (r0 == 0) ahead(k);
          // S = q[r0:r1] @ k[0:r1]ᵀ, only up to the diagonal (query r0 + i sees keys 0..r0 + i)
          cpu::small_gemm<S>(m, r1, hd, {qm.p + r0 * qm.ld, qm.ld, 1}, kt.data(), T, p + r0 * T, T, false,
                             cpu::Skip::unneeded_after(r0));
          next_block(i, r1);
          if (r0 == 0) ahead(q);
          // P = causal softmax of S's rows, in place; zeros past the diagonal, out to column T
          cpu::causal_softmax_rows(p + r0 * T, p + r0 * T, T, m, T, r0 + 1, S(scale));
          if (r0 == 0) {
            ahead(v);
            if (next) cpu::prefetch_rows(p + T * T, T, T, T);  // head i + 1's P and y, about to be written
            ahead(r.y);
          }
          // y = P @ v[0:r1]; P(i, s) == 0 for keys s > r0 + i
          cpu::small_gemm<S>(m, hd, r1, {p + r0 * T, T, 1}, vm.p, vm.ld, ym.p + r0 * ym.ld, ym.ld, false,
                             cpu::Skip::zeros_after(r0));
        }
      }
    });
  });
  return r;
}

CausalAttentionGrads causal_attention_backward(const Tensor& dy_in, const Tensor& q_in, const Tensor& k_in,
                                               const Tensor& v_in, const Tensor& att, double scale) {
  profile::Scope prof("attention bwd", 8.0 * double(q_in.numel()) * double(q_in.dim() == 4 ? q_in.size(2) : 0),
                      double(8 * q_in.numel()) * double(element_size(q_in.dtype())));
  check_qkv("causal_attention_backward", q_in, k_in, v_in);
  LOOM_CHECK(dy_in.shape() == q_in.shape() && dy_in.dtype() == q_in.dtype() && dy_in.device().is_cpu(),
             "causal_attention_backward: grad ", dy_in.describe(), " does not match q ", q_in.describe());
  const Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const Tensor dy = rows_contiguous(dy_in), p_all = contiguous(att);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  LOOM_CHECK(p_all.shape() == Shape({B, H, T, T}), "causal_attention_backward: att ", p_all.shape(),
             " is not [B, H, T, T] for q ", q.shape());
  CausalAttentionGrads g = packed_grads(q);
  if (T == 0) return g;
  LOOM_DISPATCH_COMPUTE(q.dtype(), "causal_attention_backward", {
    using S = scalar_t;
    const bool prefetch = prefetch_next_head<S>(T, hd);
    cpu::parallel_for_tasks(B * H, [&](int64_t i0, int64_t i1) {
      std::vector<S> ds(size_t(kBlock * T));  // dP, then dS, of one block: [m, r1]
      std::vector<S> vt(size_t(hd * T));      // vᵀ [hd, T] of one head
      // Heads too large for the next head's prefetch: the next block's rows (blocks run backwards), dy, P, q
      // and dq (to be written); after a head's first block, head i + 1's last block's rows. Head i + 1's v (its
      // transpose comes first), k, dk and dv (its last block covers every key) go one block earlier: this
      // head's last block (r0 = 0) is its smallest, too short to fetch them in.
      const int64_t last0 = (T - 1) / kBlock * kBlock;
      auto next_block = [&](int64_t i, int64_t r0) {
        if (prefetch) return;
        const bool next_head = i + 1 < i1;
        if (next_head && r0 == std::min(kBlock, last0)) {
          prefetch_head<S>(v, i + 1);
          prefetch_head<S>(k, i + 1);
          prefetch_head_rows<S, true>(g.dv, i + 1, 0, T);
          prefetch_head_rows<S, true>(g.dk, i + 1, 0, T);
        }
        if (r0 == 0 && !next_head) return;
        const int64_t n = r0 > 0 ? i : i + 1, n0 = r0 > 0 ? r0 - kBlock : last0, n1 = std::min(T, n0 + kBlock);
        prefetch_head_rows<S>(dy, n, n0, n1);
        cpu::prefetch_rows(p_all.data<S>() + n * T * T + n0 * T, T, n1 - n0, n1);
        prefetch_head_rows<S>(q, n, n0, n1);
        prefetch_head_rows<S, true>(g.dq, n, n0, n1);
      };
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / H, h = i % H;
        const Mat<S> qm = head<S>(q, b, h), km = head<S>(k, b, h), vm = head<S>(v, b, h), dym = head<S>(dy, b, h);
        const bool next = prefetch && i + 1 < i1;
        auto ahead = [&](const Tensor& t) {  // as in the forward
          if (next) prefetch_head<S>(t, i + 1);
        };
        cpu::transpose_into(vm.p, vm.ld, T, hd, vt.data(), T);
        const Mat<S> dq = head<S>(g.dq, b, h), dk = head<S>(g.dk, b, h), dv = head<S>(g.dv, b, h);
        const S* p = p_all.data<S>() + i * T * T;
        ahead(v);
        ahead(dy);
        for (int64_t r0 = (T - 1) / kBlock * kBlock; r0 >= 0; r0 -= kBlock) {
          const int64_t r1 = std::min(T, r0 + kBlock), m = r1 - r0;
          if (next && r1 == T) {  // the head's first block: head i + 1's P, q, k, and dq, dk, dv to be written
            cpu::prefetch_rows(p + T * T, T, T, T);
            ahead(q);
            ahead(k);
            ahead(g.dq);
            ahead(g.dk);
            ahead(g.dv);
          }
          const bool beta = r1 != T;  // the last block covers every key: it starts dk and dv
          const S* dyb = dym.p + r0 * dym.ld;
          // dP = dy[r0:r1] @ v[0:r1]ᵀ up to the diagonal (the softmax backward reads no further)
          cpu::small_gemm<S>(m, r1, hd, {dyb, dym.ld, 1}, vt.data(), T, ds.data(), r1, false,
                             cpu::Skip::unneeded_after(r0));
          // dS = causal softmax backward of dP's rows, in place (the scale inside)
          cpu::causal_softmax_backward_rows(ds.data(), r1, p + r0 * T, T, ds.data(), r1, m, r1, r0 + 1, S(scale));
          next_block(i, r0);
          // dv[0:r1] += Pᵀ @ dy[r0:r1]; key s gets nothing from the block's queries before it (Pᵀ(s, i) == 0
          // for i < s - r0), nor dk[0:r1] += dSᵀ @ q[r0:r1]; dq[r0:r1] = dS @ k[0:r1] skips keys past the diagonal
          cpu::small_gemm<S>(r1, hd, m, {p + r0 * T, 1, T}, dyb, dym.ld, dv.p, dv.ld, beta,
                             cpu::Skip::zeros_before(-r0));
          cpu::small_gemm<S>(m, hd, r1, {ds.data(), r1, 1}, km.p, km.ld, dq.p + r0 * dq.ld, dq.ld, false,
                             cpu::Skip::zeros_after(r0));
          cpu::small_gemm<S>(r1, hd, m, {ds.data(), 1, r1}, qm.p + r0 * qm.ld, qm.ld, dk.p, dk.ld, beta,
                             cpu::Skip::zeros_before(-r0));
        }
      }
    });
  });
  return g;
}

}  // namespace loom::ops
