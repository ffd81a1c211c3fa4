#include "parallel/context_parallel/ring_attention.h"

#include <array>
#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "parallel/context_parallel/ring_trace.h"
#include "parallel/context_parallel/zigzag.h"
#include "parallel/teach/symptoms.h"
#include "parallel/teach/teach_break.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

constexpr int kKVTag = 1, kGradKVTag = 2;  // the two kinds of message on the cp group

// Chunk i of x along T: [B, H, 2c, hd] -> [B, H, c, hd] (a view).
Tensor chunk(const Tensor& x, int i) {
  const int64_t c = x.size(2) / 2;
  return ops::narrow(x, 2, i * c, c);
}
// Chunk i of K (which 0) or V (which 1) in a packed kv buffer [2, B, H, 2c, hd] (a view).
Tensor kv_chunk(const Tensor& kv, int which, int i) { return chunk(ops::squeeze(ops::narrow(kv, 0, which, 1), 0), i); }

// S = q kᵀ / sqrt(hd), the future hidden in a diagonal block: [B, H, c, hd] x [B, H, c, hd] -> [B, H, c, c].
Tensor scores(const Tensor& q, const Tensor& k, double scale, bool diagonal) {
  Tensor s = ops::mul(ops::matmul(q, ops::transpose(k, -2, -1)), scale);
  return diagonal ? ops::causal_mask_fill(s, -std::numeric_limits<double>::infinity()) : s;
}

Tensor maximum(const Tensor& a, const Tensor& b) { return ops::where(ops::gt_scalar(ops::sub(a, b), 0.0), a, b); }

// The online softmax of one query chunk's rows (the rule in the header).
struct OnlineSoftmax {
  Tensor m, l, acc;  // running max, sum of e^(S - m) [B, H, c, 1]; e^(S - m) V [B, H, c, hd]

  void absorb(const Tensor& s, const Tensor& v) {
    Tensor m_new = ops::max(s, -1, /*keepdim=*/true).first;
    if (m.defined()) m_new = maximum(m, m_new);
    Tensor p = ops::exp(ops::sub(s, m_new));  // [B, H, c, c]
    Tensor l_blk = ops::sum(p, {-1}, /*keepdim=*/true), pv = ops::matmul(p, v);
    if (!m.defined()) {
      m = m_new, l = l_blk, acc = pv;
      return;
    }
    Tensor correction = ops::exp(ops::sub(m, m_new));  // what was summed under the old max, rescaled
    if (teach::broken(teach::Break::RingNoMaxCorrection)) correction = teach::drop_correction(m, m_new);
    l = ops::add(ops::mul(l, correction), l_blk);
    acc = ops::add(ops::mul(acc, correction), pv);
    m = m_new;
  }
  Tensor out() const { return ops::div(acc, l); }
  Tensor lse() const { return ops::add(m, ops::log(l)); }
};

// One hop of the ring in flight: `send` to rank `to`, `recv` from rank
// `from`, both posted at once. Even ranks post the send first, odd ranks the
// receive, so a backend that runs them one at a time in order (a queue) still
// pairs every send with a posted receive. wait(): both done (and, with
// --trace, the hop's span closed: ring_trace.h). The hop keeps its send
// buffer alive until then: the caller may drop it (backward's dK/dV does).
struct Hop {
  std::vector<std::shared_ptr<Work>> works;
  Tensor sending;
  RingHopSpan span;
  void wait() {
    for (const auto& w : works) w->wait();
    works.clear(), sending = Tensor(), span.close();
  }
};
Hop hop(ProcessGroup& cp, const Tensor& send, int to, const Tensor& recv, int from, int tag, char pass,
        const char* what) {
  Hop h{{}, send, RingHopSpan(pass, what, send.numel() * int64_t(element_size(send.dtype())))};
  if (cp.rank() % 2 == 0) h.works = {cp.isend(send, to, tag), cp.irecv(recv, from, tag)};
  else h.works = {cp.irecv(recv, from, tag)}, h.works.push_back(cp.isend(send, to, tag));
  return h;
}

DType math_dtype(const Tensor& q) { return q.dtype() == kFloat64 ? kFloat64 : kFloat32; }

// The second ring: dQ stays home, dK/dV travel with their K/V block (to the
// previous rank this time) and arrive home after the last step. With the
// saved out and lse every block's softmax weights are P = e^(S - lse), and
//   dV += Pᵀ dO,  dS = P (dO Vᵀ - rowsum(dO out)),  dQ += dS K / sqrt(hd),  dK += dSᵀ Q / sqrt(hd).
// Both hops overlap the math (Megatron's order): step s computes its block's
// dK/dV from zero while the earlier holders' sum for that block travels to
// it (the dK/dV hop posted at the end of step s - 1), then adds the two and
// posts the total onward; K/V for step s + 1 travel during step s as in forward.
autograd::TensorList ring_attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& out, const Tensor& lse, ProcessGroup& cp, double scale) {
  const int N = cp.size(), r = cp.rank(), prev = (r - 1 + N) % N, next = (r + 1) % N;
  const DType math = math_dtype(q);
  const Tensor dout = ops::to(grad, math);
  std::array<Tensor, 2> qc, doc, lsec, D, dq;
  for (int i = 0; i < 2; ++i) {
    qc[i] = ops::to(chunk(q, i), math), doc[i] = chunk(dout, i), lsec[i] = chunk(lse, i);
    D[i] = ops::sum(ops::mul(doc[i], chunk(out, i)), {-1}, /*keepdim=*/true);  // [B, H, c, 1]
    dq[i] = zeros(qc[i].shape(), math, q.device());
  }
  Tensor kv = ops::stack({k, v}, 0);  // [2, B, H, 2c, hd], the block held
  Tensor dkv;                         // [2, B, H, 2c, hd]: the dK, dV of the block held, summed so far
  Hop dkv_hop;                        // the last step's dK/dV on its way to the previous rank
  Tensor dkv_arriving;                // ... and the next rank's arriving here
  for (int s = 0; s < N; ++s) {
    const int src = (r + s) % N;  // whose K/V this rank holds at step s
    Tensor kv_next;
    Hop kv_hop;
    if (s + 1 < N) kv_next = empty_like(kv), kv_hop = hop(cp, kv, prev, kv_next, next, kKVTag, 'B', "K/V");
    dkv = zeros(kv.shape(), math, kv.device());
    const std::vector<ZigzagBlock> blocks = zigzag_blocks(r, src, N);
    {
      RingStepSpan traced('B', s, src, N, blocks);  // --trace: this step's blocks (ring_trace.h)
      for (const auto& [i, j, q_chunk, k_chunk, diagonal] : blocks) {
        const Tensor kj = ops::to(kv_chunk(kv, 0, j), math), vj = ops::to(kv_chunk(kv, 1, j), math);
        Tensor p = ops::exp(ops::sub(scores(qc[i], kj, scale, diagonal), lsec[i]));  // [B, H, c, c]
        Tensor ds = ops::mul(p, ops::sub(ops::matmul(doc[i], ops::transpose(vj, -2, -1)), D[i]));
        ops::add_(dq[i], ops::matmul(ds, kj), scale);
        ops::add_(kv_chunk(dkv, 0, j), ops::matmul(ops::transpose(ds, -2, -1), qc[i]), scale);
        ops::add_(kv_chunk(dkv, 1, j), ops::matmul(ops::transpose(p, -2, -1), doc[i]));
      }
    }
    if (s > 0) dkv_hop.wait(), ops::add_(dkv, dkv_arriving);  // + what the earlier holders summed
    kv_hop.wait();
    if (N > 1) {  // dK/dV follow their block; after the last step, home
      dkv_arriving = empty_like(dkv);
      dkv_hop = hop(cp, dkv, prev, dkv_arriving, next, kGradKVTag, 'B', "dK/dV");
    }
    if (kv_next.defined()) kv = kv_next;
  }
  if (N > 1) dkv_hop.wait(), dkv = dkv_arriving;  // this rank's own block, every rank's share summed
  Tensor dk = ops::squeeze(ops::narrow(dkv, 0, 0, 1), 0), dv = ops::squeeze(ops::narrow(dkv, 0, 1, 1), 0);
  return {ops::to(ops::cat({dq[0], dq[1]}, 2), q.dtype()), ops::to(ops::contiguous(dk), k.dtype()),
          ops::to(ops::contiguous(dv), v.dtype())};
}

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, ProcessGroup& cp) {
  LOOM_CHECK(q.dim() == 4 && q.shape() == k.shape() && q.shape() == v.shape(),
             "ring_attention: q, k, v must be [B, H, T / cp, hd] alike, got ", q.shape(), ", ", k.shape(), ", ",
             v.shape());
  LOOM_CHECK(q.size(2) % 2 == 0, "ring_attention: each rank holds two equal chunks of the sequence (zig-zag), but "
             "it has ", q.size(2), " tokens");
  const int N = cp.size(), r = cp.rank(), prev = (r - 1 + N) % N, next = (r + 1) % N;
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  const DType math = math_dtype(q);
  const std::array<Tensor, 2> qc{ops::to(chunk(q, 0), math), ops::to(chunk(q, 1), math)};
  Tensor kv = ops::stack({k, v}, 0);  // [2, B, H, 2c, hd]: one message a hop
  std::array<OnlineSoftmax, 2> rows;  // one per query chunk
  for (int s = 0; s < N; ++s) {
    const int src = (r - s + N) % N;  // whose K/V this rank holds at step s
    // Pass the block on while computing with it.
    Tensor kv_next;
    Hop kv_hop;
    if (s + 1 < N) kv_next = empty_like(kv), kv_hop = hop(cp, kv, next, kv_next, prev, kKVTag, 'F', "K/V");
    const std::vector<ZigzagBlock> blocks = zigzag_blocks(r, src, N);
    {
      RingStepSpan traced('F', s, src, N, blocks);  // --trace: this step's blocks (ring_trace.h)
      for (const auto& [i, j, q_chunk, k_chunk, diagonal] : blocks)
        rows[size_t(i)].absorb(scores(qc[size_t(i)], ops::to(kv_chunk(kv, 0, j), math), scale, diagonal),
                               ops::to(kv_chunk(kv, 1, j), math));
    }
    kv_hop.wait();
    if (kv_next.defined()) kv = kv_next;
  }
  const Tensor out = ops::cat({rows[0].out(), rows[1].out()}, 2);  // [B, H, 2c, hd], math dtype
  const Tensor lse = ops::cat({rows[0].lse(), rows[1].lse()}, 2);  // [B, H, 2c, 1]
  return autograd::record("RingAttention", {&q, &k, &v}, ops::to(ops::clone(out), q.dtype()),
                          [q, k, v, out, lse, &cp, scale](const autograd::TensorList& g) {
                            return ring_attention_backward(g[0], q, k, v, out, lse, cp, scale);
                          });
}

nn::AttentionCore ring_attention_core(ProcessGroup& cp) {
  return [&cp](const Tensor& q, const Tensor& k, const Tensor& v, nn::Dropout* attn_dropout) {
    LOOM_CHECK(!attn_dropout || attn_dropout->p == 0.0 || !attn_dropout->is_training(),
               "ring attention: attention dropout (p = ", attn_dropout->p,
               ") is not supported under context parallelism (its mask would differ from one process's); "
               "train with --dropout 0");
    return ring_attention(q, k, v, cp);
  };
}

}  // namespace loom::parallel
