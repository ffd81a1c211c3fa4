#include "optim/activation_moments.h"

#include <algorithm>

#include "optim/ring_activations.h"

namespace loom::optim {

// The temporaries of one Linear's backward (tensor/ops_linear.cpp) at its last
// large allocation, for x [M, K], w [n, K], the incoming gradient [M, n]
// already counted by the caller. fp32: dx [M, K], dW [n, K], and for a bias
// its column sums in double then fp32. 16-bit: the kernel works on fp32
// copies: the gradient's [M, n], dx in fp32 then rounded (the fp32 freed), x's
// [M, K], dW in fp32 and its rounded copy. Native bf16 GEMMs (`native`): as
// fp32, in e bytes (the column sums in double, then bf16).
double linear_backward_temporaries(double M, double K, double n, double e, bool bias, bool native) {
  if (e == 4 || native) return e * (M * K + n * K) + (bias ? (8 + e) * n : 0);
  return 4 * M * n + e * M * K + 4 * M * K + (4 + e) * n * K;
}

double block_kept_now(const ActivationCase& c, const Sizes& z) {
  return z.block_kept - (c.recompute == parallel::Recompute::Selective ? z.scores_kept : 0);
}

double linear_dx_temporaries(double M, double K, double n, double e, bool native) {
  return e == 4 || native ? e * M * K : 4 * M * n + 4 * M * K + e * M * K;
}

double norm_backward_temporaries(double R, double h, double e, bool rmsnorm) {
  const double vectors = rmsnorm ? 1 : 2;  // dweight (and dbias)
  if (e == 4) return 4 * R * h + vectors * 4 * h;
  return (12 + e) * R * h + (4 + vectors * (4 + e)) * h;
}

// What one block's attention keeps of q, k and v, in elements per token
// (before / t). c_attn's output [N, h + 2 kv] is kept while any of q, k, v is
// a view of it; RoPE makes new q and k ([N, h], [N, kv]); repeat_kv makes new
// k and v [N, h] when it must copy - more than one kv head per rank repeated
// (one kv head is repeated as a view: stride 0 over the query heads).
//   GPT-2 (no RoPE, kv = h)               c_attn's output           3h
//   Llama, kv heads = heads               c_attn's output, q', k'   5h
//   Llama, GQA, > 1 kv head per rank      q', k and v repeated      3h
//   Llama, 1 kv head per rank (MQA)       c_attn's output, q', k'   2h + 3 kv
double kv_width(const ActivationCase& c) {
  return double(c.kv_heads > 0 ? c.kv_heads : c.heads) * double(c.width) / double(c.heads);
}
bool repeat_kv_copies(const ActivationCase& c) {
  const int64_t kv_heads = c.kv_heads > 0 ? c.kv_heads : c.heads;
  return kv_heads < c.heads && kv_heads / c.tp > 1;
}
double attention_qkv_elements(const ActivationCase& c) {
  const double h = double(c.width), kv = kv_width(c);
  const bool copies = repeat_kv_copies(c);
  const bool c_attn_kept = !c.rope || !copies;  // q (no RoPE) or v (not copied) is its view
  return (c_attn_kept ? h + 2 * kv : 0) + (c.rope ? h : 0) + (copies ? 2 * h : c.rope ? kv : 0);
}

// (A)'s second part, inside the head layer's backward: the logits freed, their gradient in the model's
// dtype and the head linear's temporaries (x = ln_f's output [N, h], w = wte [V'/t, h]).
double at_head_linear(const ActivationCase& c, const Sizes& z) {
  if (!c.has_head) return 0;
  const double N = z.N, V = z.V, t = z.t, e = z.e;
  return -(z.logits + (c.tp > 1 ? 2 : 1) * N * 4) + N * V / t * e +
         linear_backward_temporaries(N, z.h, V / t, e, false, z.native);
}

namespace {

// (A) The head's backward, everything still kept: the loss's gradient of
//     the logits (fp32; with tp also rounded to the model's dtype), or, once
//     the logits are freed, that gradient in the model's dtype and the head
//     linear's temporaries (x = ln_f's output [N, h], w = wte [V'/t, h]).
double at_head(const ActivationCase& c, const Sizes& z) {
  if (!c.has_head) return 0;
  const double loss_grad = z.logits + (c.tp > 1 && z.e != 4 ? z.N * z.V / z.t * z.e : 0);
  return std::max(loss_grad, at_head_linear(c, z));
}

// (D) ln_f's backward, after the head's: the logits, the loss's per-row
//     numbers and ln_f's output (gathered, under SP) are freed; alive are
//     the gradient of ln_f's output [Ns, h], the norm's temporaries
//     and the head's wte gradient where one rank holds both ends. Under
//     SP, before it, the gather's backward: the full gradient [N, h], its
//     copy laid out for the reduce-scatter, the scattered result [Ns, h],
//     and for 16-bit the collective's fp32 buffers of both (parallel/comm);
//     fp32 reduces in place, and the peak is the result's copy laid back
//     out [b, s/t, h] (mappings.cpp's dim_back), both still alive.
//     The peak for bf16 with native GEMMs, whose (B) is small.
double at_ln_f(const ActivationCase& c, const Sizes& z) {
  if (!c.has_head) return 0;
  const double N = z.N, h = z.h, e = z.e, local = z.local;
  const double freed = z.logits + (c.tp > 1 ? 2 : 1) * N * 4 + z.unit;
  double at = -freed + local + norm_backward_temporaries(z.Ns, h, e, c.rmsnorm) + z.wte_grad;
  if (c.sequence_parallel)
    at = std::max(at, -freed + 2 * z.unit + local + (e == 4 ? local : 4 * N * h + 4 * z.Ns * h) + z.wte_grad);
  return at;
}

// What the head and the stage's output free once the blocks' backward starts.
double freed_head(const ActivationCase& c, const Sizes& z) { return c.has_head ? z.head + z.local : 0; }

// (B) The last block's mlp.c_proj backward: the head's tensors and the
//     stage's output are freed (on the stage with the head); alive are the
//     gradient of the block's output (ln_f's, or the one received), under
//     SP also its all-gathered copy, and c_proj's temporaries (x = the
//     MLP's hidden [N, F/t], w [h, F/t]; its bias is inside the linear only
//     without tp). Where one rank holds both ends of the tied wte, the
//     head's wte gradient waits for the embedding's.
double at_block(const ActivationCase& c, const Sizes& z) {
  return -freed_head(c, z) + z.local + (c.sequence_parallel ? z.unit : 0) +
         linear_backward_temporaries(z.N, z.F / z.t, z.h, z.e, c.bias && c.tp == 1, z.native) + z.wte_grad;
}

// (B') SwiGLU: then the product's backward (silu(gate) * up): the product
//     is freed; alive are c_proj's dx [N, F/t] and the two gradients it
//     makes, [N, F/t] each. The peak for Llama's shapes in fp32.
double at_gate(const ActivationCase& c, const Sizes& z) {
  return -freed_head(c, z) + z.local + 2 * z.N * z.F / z.t * z.e + z.wte_grad;
}

// (C) The last block's attention backward, in the softmax's backward: of
//     the block, still kept are x, ln_1's output and its statistics,
//     q, k, v and the softmax; alive are the residual gradient (and on a
//     stage without the head the received one it was summed from), v's
//     gradient [b, a, s, s / a] (waiting for q's and k's), the softmax's
//     incoming gradient [b, a, s, s] and its result; 16-bit also fp32
//     copies of that gradient and of the softmax, and the result in fp32
//     before it is rounded. Before it, att @ v's backward: its incoming
//     gradient (the merged heads') and, making v's gradient, the fp32
//     copies of attᵀ and that gradient and the result in fp32 and rounded.
double at_attention(const ActivationCase& c, const Sizes& z) {
  const double N = z.N, h = z.h, t = z.t, e = z.e, unit = z.unit, local = z.local;
  const double scores = N * z.a * z.s / t;  // [b, a/t, s, s] elements
  // Freed by now: the head and the stage's output, the block's h, ln_2's
  // output and statistics, the MLP's kept tensors, the merged heads.
  const double freed = freed_head(c, z) + local + z.gathers * unit + z.stats + z.mlp_bytes + N * h / t * e;
  // att @ v's backward has freed v, and with it the tensor v lives in when
  // nothing else holds it: repeat_kv's copy [N, h/t], or (RoPE: q and k are
  // new tensors) c_attn's output; not under selective recomputation, whose
  // checkpoint holds q, k, v.
  const bool v_held = !c.rope && !repeat_kv_copies(c);  // q is a view of c_attn's output too
  const double v_freed = c.recompute == parallel::Recompute::Selective || v_held ? 0
                         : repeat_kv_copies(c) ? unit / t
                                               : N * (h + 2 * kv_width(c)) / t * e;
  const double softmax_bwd = scores * (e == 4 ? 2 * 4 : 2 * e + 3 * 4) + unit / t - v_freed;
  const double matmul_bwd = e == 4   ? 0
                            : z.native ? unit / t + scores * e + N * h / t * e
                                       : unit / t + scores * (e + 4) + N * h / t * (4 + 4 + e);
  const double received = c.has_head ? 0 : local;  // held by the pipeline, so the residual's sum is a new tensor
  // The fused op's backward (fp32 on the CPU): its incoming gradient and dq, dk, dv, [N, h/t] each.
  // Under --cp the ring's backward (ring_activations.h).
  const double attention_bwd = c.cp > 1             ? ring_backward_bytes(c, z)
                               : c.fused_attention ? 4 * unit / t
                                                   : std::max(softmax_bwd, matmul_bwd);
  return -freed + local + received + attention_bwd + z.wte_grad;
}

// (E) The last block's ln_2 backward: the MLP's tensors and ln_2's output
//     (under SP its gathered copies) are freed; alive are the residual
//     gradient, the gradient of ln_2's output (no tp: c_fc's dx [N, h]; tp:
//     its all-reduced sum [N, h]; SP: its reduce-scattered [Ns, h]) and
//     the norm's backward temporaries (16-bit: on fp32 copies). The peak
//     of full recomputation under tp in 16-bit, with native GEMMs.
double at_ln_2(const ActivationCase& c, const Sizes& z) {
  return -freed_head(c, z) + z.local + z.wte_grad - z.mlp_bytes - z.gathers * z.unit +
         (c.sequence_parallel ? z.local : z.unit) + norm_backward_temporaries(z.Ns, z.h, z.e, c.rmsnorm);
}

// (F) Full recomputation under tp: the rerun's forward runs the block's
//     collectives inside backward. At the last one, the MLP's all-reduce
//     (SP: reduce-scatter), the rerun holds all the block keeps but its
//     output, not yet made (under SP also ln_2's sharded output, a
//     temporary of the forward's expression), and the collective's
//     tensors: c_proj's partial sums [N, h] and their sum (SP: a copy laid
//     out for the reduce-scatter and the result [Ns, h]); 16-bit reduces
//     in fp32 buffers (parallel/comm: [N, h], and SP's result [Ns, h]);
//     fp32 SP, in place, peaks after it: the result laid back out [Ns, h].
double at_rerun_collective(const ActivationCase& c, const Sizes& z) {
  // A MoE block has no MLP collective: its rerun's last is attention's, before the MoE's rerun (U), the
  // larger (moe_rerun below; measured = formula at tp 2 fp32 and SP bf16, tests/test_memory_ledger_moe.cpp).
  if (c.blocks == 0 || c.tp == 1 || c.recompute != parallel::Recompute::Full || c.moe_experts > 0) return 0;
  const double local = z.local, sp = c.sequence_parallel ? local : 0;
  return -freed_head(c, z) + local + z.wte_grad + z.block_kept - local + sp + 2 * z.unit + sp +
         (z.e == 4 ? sp : 4 * z.N * z.h + (c.sequence_parallel ? 4 * z.Ns * z.h : 0));
}

}  // namespace

Moments backward_moments(const ActivationCase& c, const Sizes& z) {
  Moments m;
  m.head = at_head(c, z);
  m.ln_f = at_ln_f(c, z);
  if (c.blocks > 0) {
    m.block = at_block(c, z);
    if (c.swiglu) m.gate = at_gate(c, z);
    if (c.moe_experts > 0)  // no c_proj: the MoE block's own backward (optim/moe_activations.h) in (B)'s place
      m.block = m.gate = -freed_head(c, z) + z.local + moe_backward_bytes(c) + z.wte_grad;
    m.attention = at_attention(c, z);
    m.ln_2 = at_ln_2(c, z);
  }
  m.rerun_collective = at_rerun_collective(c, z);
  // (R) ZeRO-3: the last block's backward done - its kept bytes, the head's and the stage's output let go, its
  // input gradient alive (and on a stage without the head the received one, held by the pipeline) - when its
  // unit's last gradient comes (zero3_activations.h counts the unit's bytes). Under full recomputation the
  // checkpoint's input stays kept and the rebuilt block is let go; alive are the rerun's output and the
  // gradient it came with (on a stage without the head the received one), which the checkpoint holds until
  // its backward ends, and the input gradient: 3 [b, s, h].
  if (c.zero3.on && c.blocks > 0)
    m.unit_reduce = c.recompute == parallel::Recompute::Full
                        ? -freed_head(c, z) + 3 * z.local + z.wte_grad
                        : -freed_head(c, z) - block_kept_now(c, z) + z.local + (c.has_head ? 0 : z.local) + z.wte_grad;
  // The last block's backward runs inside its rerun (autograd/checkpoint.h),
  // which holds the rerun's output and the gradient it came with until its
  // backward ends. Selective: at (C) the core's rerun has rebuilt the
  //   softmax, and holds its output and that output's gradient, [b, a/t, s,
  //   hd] each; (B) comes before it.
  // Full: at (B) and (C) the whole block is rebuilt - every activation but x,
  //   which the rerun shares with the kept input - and its output (replicated)
  //   is held: block_kept - local + local. At (C) the block's output gradient
  //   is held too (on a stage without the head the pipeline holds it already).
  //   Under --cp the rerun is the ring's (scores_kept: its out and lse), whose moment counts the gradient.
  if (c.recompute == parallel::Recompute::Selective) m.attention += z.scores_kept + (c.cp > 1 ? 1 : 2) * z.unit / z.t;
  if (c.recompute == parallel::Recompute::Full && c.blocks > 0) {  // (a chunk of the head alone reruns none)
    // A MoE block's rerun passes its (U): the head's tensors and the stage's output freed; alive the
    // block's output gradient (+ local) and the rebuilt block but x, the kept input it shares (- local).
    if (c.moe_experts > 0)
      m.moe_rerun = -freed_head(c, z) + z.wte_grad + z.block_kept + moe_forward_bytes(c);
    m.block += z.block_kept, m.attention += z.block_kept + (c.has_head ? z.local : 0);
    if (c.swiglu) m.gate += z.block_kept;
    m.ln_2 += z.block_kept;
  }
  return m;
}

// Without a main_grad buffer (fp32, dp 1, no ZeRO) backward keeps .grad
// tensors (fp32): at (B), ln_f's weight (and bias), the head's own wte
// (untied, or on a rank without the embedding) and, with tp, c_proj's bias
// (outside the linear); at (B') also c_proj's weight; at (C) also the
// MLP's, ln_2's and attn.c_proj's.
Moments grads_at(const ActivationCase& c, const Sizes& z) {
  const double h = z.h, t = z.t, F = z.F, V = z.V;
  const bool grads_kept = c.grad_bytes > 0;
  const double F_shared = double(c.moe_shared_experts) * F / t;  // the shared experts' SwiGLU, split over tp
  const double norm_weights = c.rmsnorm ? h : 2 * h;
  const double head_weight = c.has_head && (!c.tied || !c.has_embedding) ? V / t * h * 4 : 0;
  // The MLP's matrices, and its column-parallel ones (their biases split over tp).
  const double mlp_matrices = c.swiglu ? 3 : 2, mlp_columns = c.swiglu ? 2 : 1;
  Moments g;
  g.block = grads_kept && c.blocks > 0
      ? (c.has_head ? norm_weights * 4 : 0) + head_weight + (c.tp > 1 && c.bias ? h * 4 : 0)
      : 0;
  g.gate = grads_kept && c.swiglu && c.blocks > 0
      ? g.block + 4 * (h * F / t + (c.bias && c.tp == 1 ? h : 0))
      : 0;
  g.ln_2 = grads_kept && c.blocks > 0  // (E): the MLP's weights (and biases) too
      ? g.block + 4 * (mlp_matrices * h * F / t + (c.bias ? mlp_columns * F / t + (c.tp > 1 ? 0 : h) : 0))
      : 0;
  // The router's and every expert's instead; none at the MoE's own peak (a chunk of the head alone: none).
  if (grads_kept && c.moe_experts > 0 && c.blocks > 0) {
    g.gate = g.block;
    g.ln_2 = g.block + 4 * (double(c.moe_experts) * (h + 3 * h * F) + 3 * h * F_shared);
  }
  g.attention = grads_kept && c.blocks > 0  // (C): ln_2's and attn.c_proj's too
      ? g.ln_2 + 4 * (norm_weights + h * h / t + (c.bias ? h : 0))
      : 0;
  g.rerun_collective = grads_kept ? (c.has_head ? norm_weights * 4 : 0) + head_weight : 0;  // (F): the head's
  // Full recomputation with .grad tensors: each later block whose backward
  // has run leaves its gradients (12 h²/t + 7 h/t + 6 h for GPT-2, fp32) and
  // frees only its input (one replicated unit); when those gradients are the
  // larger, the peak moves to the FIRST block's rerun, blocks - 1 such blocks later.
  // With a capacity the blocks differ (their kept rows): the caller gives each block's rerun as the last of
  // `blocks`, rerun_blocks_after blocks past it done, their inputs let go and their gradients alive.
  if (c.recompute == parallel::Recompute::Full && grads_kept && (c.blocks > 1 || c.rerun_blocks_after > 0)) {
    const double kv = kv_width(c);
    // A MoE block's: its router's and every expert's, whole on every tp rank (not / t).
    const double mlp = c.moe_experts > 0 ? double(c.moe_experts) * (h + 3 * h * F) + 3 * h * F_shared
                                         : mlp_matrices * h * F / t;
    const double matrices = (2 * h * h + 2 * h * kv) / t + mlp;
    const double biases = c.bias ? (h + 2 * kv + mlp_columns * F) / t + 2 * h : 0;
    const double block_grads = 4 * (matrices + biases + 2 * norm_weights);
    const double later = c.rerun_blocks_after >= 0 ? double(c.rerun_blocks_after) * block_grads
                                                   : double(c.blocks - 1) * std::max(0.0, block_grads - z.local);
    g.block += later;
    g.attention += later, g.ln_2 += later, g.rerun_collective += later;
    if (c.swiglu) g.gate += later;
  }
  g.ln_f = grads_kept ? head_weight : 0;  // the head's own wte
  return g;
}

}  // namespace loom::optim
