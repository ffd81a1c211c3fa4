#include "optim/split_backward.h"

#include <algorithm>

namespace loom::optim {

namespace {

double norm_vectors(const ActivationCase& c) { return c.rmsnorm ? 1 : 2; }  // a norm's weight (and bias)

// One block's linears' X and dY and its norms' gradients (the header's table).
double block_held(const ActivationCase& c, const Sizes& z) {
  const double N = z.N, h = z.h, t = z.t, F = z.F, e = z.e;
  const double mlp_inputs = c.swiglu ? 2 : 1;  // c_gate and c_fc, or c_fc
  // The attention's X: ln_1's output and the merged heads; its dY: c_attn's [N, (h + 2 kv)/t], attn.c_proj's [N, h].
  const double attention = z.unit + N * h / t * e + N * (h + 2 * kv_width(c)) / t * e + z.unit;
  // The MLP's X: ln_2's output (as the MLP keeps it; a MoE block's router reads it), gelu's output
  // (SwiGLU: the product); its dY: c_fc's (and c_gate's) [N, F/t], mlp.c_proj's [N, h]. A MoE block's
  // router and experts in their place (moe_activations.h).
  const double mlp = z.gathers * z.unit + (c.moe_experts > 0 ? moe_held_until_w(c)
                                                             : N * F / t * e + mlp_inputs * N * F / t * e + z.unit);
  return attention + mlp + 2 * norm_vectors(c) * h * e;
}

// The head's: its linear's X (ln_f's output) and dY (the logits' gradient, [N, V'/t]), ln_f's gradients.
double head_held(const ActivationCase& c, const Sizes& z) {
  return c.has_head ? z.unit + z.N * z.V / z.t * z.e + norm_vectors(c) * z.h * z.e : 0;
}

// The embedding's dY: the tokens' [N, h] and, with learned positions, the positions' [s, h].
double embedding_held(const ActivationCase& c, const Sizes& z) {
  return c.has_embedding ? z.unit + (c.rope ? 0 : z.s * z.h * z.e) : 0;
}

// ZeRO-3: B's j-th block before the last meets the same moments with j more blocks' units gathered (none is
// resharded before W) and j blocks' kept bytes traded for what each holds until W, the unit prefetched
// beside it the layer before (the embedding's, or none, before the stage's first block). Where a block's
// units outweigh what its B lets go of, the first blocks peak (--layers 8, --pp 2, fp32: 2.6% above the last's).
double zero3_earlier_blocks(const ActivationCase& c, const Sizes& z) {
  const Zero3Held& u = c.zero3;
  if (!u.on || !u.reshard_after_forward) return 0;  // without reshard every unit is gathered from the forward on
  // What a block keeps until its B (selective recomputation: without the attention's scores) less what it holds.
  const double kept = z.block_kept - (c.recompute == parallel::Recompute::Selective ? z.scores_kept : 0);
  const double next = u.prefetch ? 1 : 0, let_go = kept - block_held(c, z);
  double most = 0;
  for (int64_t j = 1; j < c.blocks; ++j) {
    const double before = j + 1 == c.blocks ? u.first : u.last_block;  // the layer before block j's
    most = std::max(most, double(j) * (u.last_block - let_go) + next * (before - u.before_last));
  }
  return most;
}

}  // namespace

double held_until_w(const ActivationCase& c, const Sizes& z) {
  const double embedding = embedding_held(c, z);
  // A later stage's input and its gradient, reached from the X's graph.
  const double input = c.pp_stage && !c.has_embedding ? 2 * z.local : 0;
  return double(c.blocks) * block_held(c, z) + head_held(c, z) + embedding + input;
}

double split_backward_extra(const ActivationCase& c, const Sizes& z, const Moments& m) {
  const double N = z.N, h = z.h, t = z.t, F = z.F, e = z.e, Nv = N * z.V / t;
  const double head = head_held(c, z);
  // ZeRO-3: the units B has gathered at each moment (zero3_activations.h; none without it).
  const Zero3InB units = c.zero3.on ? zero3_in_b(c.zero3, c.has_head) : Zero3InB{};
  double extra = 0;
  if (c.has_head) {
    // (A) the loss's gradient of the logits while they live, as unsplit; then
    // the head linear's B: the logits freed, their gradient (W's dY, e bytes)
    // and dx [N, h] (16-bit: from fp32 copies of the gradient and dx).
    const double loss_grad = z.logits + (c.tp > 1 && e != 4 ? Nv * e : 0);
    const double dx = e == 4 || z.native ? e * N * h : 4 * Nv + (4 + e) * N * h;
    const double head_linear = -(z.logits + (c.tp > 1 ? 2 : 1) * N * 4) + Nv * e + dx;
    // (D) ln_f's backward: as unsplit, with its output (the head's X) and the head's dY still held.
    extra = std::max({loss_grad + units.loss, head_linear + units.head, m.ln_f + z.unit + Nv * e + units.head});
  }
  // The embedding alone (a V's first chunk): B reads the received output
  // gradient, which is also the token embedding's dY (the sum passes it on),
  // and sums it over the batch for the positions' dY [s, h] (in double, then
  // e bytes). Measured to the byte on the V's stage 0 at tp 1, b 2 and 4:
  // DualPipeV peaks there at pp 3 and 4, b 2 (1156 bytes above the head's moments).
  if (c.blocks == 0 && !c.has_head) extra = z.local + (c.has_embedding && !c.rope ? (8 + z.e) * z.s * z.h : 0);
  if (c.blocks == 0) return extra;
  // (B) mlp.c_proj's B makes dx only: the unsplit moment without dW [h, F/t]
  // (fp32: and the bias's column sums; 16-bit: dW in fp32 and rounded).
  const bool bias = c.bias && c.tp == 1;
  const double dw = e == 4 || z.native ? e * h * F / t + (bias ? (8 + e) * h : 0) : (4 + e) * h * F / t;
  // (G) then gelu's backward, which the unsplit (B) outweighed: c_proj's dx
  // (16-bit: rounded, its fp32 copies freed) and gelu's gradient, [N, F/t] each.
  const double dx = e == 4 || z.native ? e * N * F / t : 4 * N * h + (4 + e) * N * F / t;
  const double at_gelu = c.swiglu ? 0 : m.block - dw - dx + 2 * N * F / t * e + head;
  // By (E) and (C) the MLP's linears have run B: their X (ln_2's and gelu's
  // outputs) and c_fc's dY are held, not freed; by (C) also the merged heads
  // (attn.c_proj's X), ln_2's gradients and, on the stage with the head, the
  // block's output gradient (ln_f's dx: mlp.c_proj's dY; a received one the
  // unsplit count already holds).
  // (B') SwiGLU's product backward: as unsplit, with the product (c_proj's X) held.
  // A MoE block's router and experts in the MLP's place (moe_activations.h).
  const double mlp = z.gathers * z.unit + (c.moe_experts > 0 ? moe_held_until_w(c, /*output_gradient=*/false)
                                                             : N * F / t * e + (c.swiglu ? 2 : 1) * N * F / t * e);
  const double at_attention = mlp + N * h / t * e + norm_vectors(c) * h * e + (c.has_head ? z.local : 0);
  const double in_block = head + units.block;  // beside each block moment: the head's held bytes, ZeRO-3's units
  if (c.moe_experts > 0) {
    // The MoE block's (M) and (X), split (moe_activations.h), in (B)'s place: the head's tensors and the
    // stage's output freed, the block's output gradient alive.
    const double moe = -(c.has_head ? z.head + z.local : 0) + z.local + moe_split_backward_bytes(c) + z.wte_grad;
    const double last = std::max({moe + in_block, m.ln_2 + in_block + mlp, m.attention + in_block + at_attention,
                                  m.rerun_collective + in_block});
    return std::max(extra, last + zero3_earlier_blocks(c, z));
  }
  const double last = std::max({m.block - dw + in_block, c.swiglu ? 0.0 : at_gelu + units.block,
                                c.swiglu ? m.gate + in_block + N * F / t * e : 0.0, m.ln_2 + in_block + mlp,
                                m.attention + in_block + at_attention, m.rerun_collective + in_block});
  return std::max(extra, last + zero3_earlier_blocks(c, z));
}

double weight_pass_extra(const ActivationCase& c, const Sizes& z) {
  // A linear's dW alone, x [M, K], w [n, K]: fp32 (and native bf16) dW [n, K]
  // and a bias's column sums (double, then e); 16-bit on fp32 copies of the
  // gradient [M, n] and x [M, K], dW in fp32 and rounded.
  auto dw = [&](double M, double K, double n, bool bias) {
    return z.e == 4 || z.native ? z.e * n * K + (bias ? (8 + z.e) * n : 0) : 4 * M * n + 4 * M * K + (4 + z.e) * n * K;
  };
  if (c.has_head) return dw(z.N, z.h, z.V / z.t, false);
  if (c.blocks > 0) return dw(z.N, z.F / z.t, z.h, c.bias && c.tp == 1);
  return z.V / z.t * z.h * z.e;  // the token embedding's dense gradient
}

}  // namespace loom::optim
