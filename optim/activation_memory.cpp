#include "optim/activation_memory.h"

#include <algorithm>
#include <string>

#include "optim/activation_moments.h"
#include "optim/moe_activations.h"
#include "optim/ring_activations.h"
#include "optim/split_backward.h"
#include "tensor/cuda/fast/gemm_lt_plan.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

// The step's ids and targets, int64, on every rank; under --cp also each micro-batch's zig-zag copies.
double step_token_bytes(const ActivationCase& c, const Sizes& z) {
  return 2 * double(c.batch_tokens) * 8 + ring_token_bytes(c, z);
}

// What one micro-batch keeps until its backward: per block and around the blocks.
ActivationPrediction kept(const ActivationCase& c, Sizes& z) {
  const double N = z.N, h = z.h, t = z.t, s = z.s, unit = z.unit, local = z.local, stats = z.stats;
  // Split over tp, per token: q, k, v, the merged heads, the softmax (the MLP's: z.mlp_mean).
  // Under --cp the ring keeps its out and lse instead of the softmax (ring_activations.h).
  const double split = (attention_qkv_elements(c) + h + (c.cp > 1 ? 0 : z.a * s)) / t;
  // x and h, and the norms' outputs; under SP x and h are sharded and each
  // column-parallel linear keeps the all-gathered input it made: c_attn
  // ln_1's, the MLP ln_2's (z.gathers: SwiGLU's c_gate and c_fc once each;
  // a MoE block, which gathers nothing, its sharded input).
  const double replicated = c.sequence_parallel ? 2 / t + 1 + z.gathers : 4;
  ActivationPrediction p;
  // Each norm also keeps its rows' statistics: two per block.
  p.per_block = unit * replicated + N * split * z.e + ring_kept_bytes(c, z) + z.mlp_mean + 2 * stats;
  // Recomputation (parallel/recompute.h) keeps less per block and rebuilds it
  // in backward: selective drops the attention core's softmax [b, a/t, s, s]
  // (q, k, v stay: they are its saved inputs); full keeps only the block's
  // input x (replicated, [b, s/t, h] under SP). What the rerun rebuilds is
  // added to the backward's moments below.
  z.block_kept = p.per_block - z.mlp_mean + z.mlp_bytes;  // the last block's (a capacity's rows differ by block)
  z.scores_kept = c.cp > 1 ? ring_kept_bytes(c, z) : N * z.a * s / t * z.e;
  if (c.recompute == parallel::Recompute::Selective) p.per_block -= z.scores_kept;
  if (c.recompute == parallel::Recompute::Full) p.per_block = local;
  // Around the blocks: the stage's output (the last block's, kept by ln_f or
  // for the pipeline's backward); the embedding's positions (s int64; none
  // with RoPE; under --cp the layer's own zig-zag ones) and, split over tp, its N local ids (int64) and mask (fp32).
  const double embedding = c.has_embedding ? (c.rope || c.cp > 1 ? 0 : 8 * s) + (c.tp > 1 ? 12 * N : 0) : 0;
  // The head: ln_f's output (gathered under SP: the linear keeps the full one),
  // ln_f's statistics, the fp32 logits the loss keeps [N, V'/t], and the
  // loss's per-row numbers in fp32 (log-sum-exp; with tp the max and the sum).
  z.logits = N * z.V / t * 4;
  z.head = c.has_head ? unit + stats + z.logits + (c.tp > 1 ? 2 : 1) * N * 4 : 0;
  p.per_micro_batch = double(c.blocks) * p.per_block + local + embedding + z.head;
  p.tokens = step_token_bytes(c, z);
  // The head's wte gradient waits for the embedding's where one rank holds both ends of the tied wte.
  z.wte_grad = c.tied && c.has_head && c.has_embedding ? z.V / t * h * z.e : 0;
  return p;
}

}  // namespace

ActivationPrediction predict_activations(const ActivationCase& c) {
  Sizes z(c);
  ActivationPrediction p = kept(c, z);
  // .grad tensors at each moment (no main_grad buffer), or under ZeRO-3 what it gathers and reduces then.
  const Moments m = backward_moments(c, z), g = c.zero3.on ? zero3_at(c, z, m) : grads_at(c, z);
  p.backward_moments = std::max({m.head + g.head, m.ln_f + g.ln_f, m.block + g.block,
                                 c.swiglu ? m.gate + g.gate : 0.0, m.ln_2 + g.ln_2, m.attention + g.attention,
                                 m.rerun_collective + g.rerun_collective,
                                 m.moe_rerun != 0 ? m.moe_rerun + g.block : 0.0,
                                 g.unit_reduce != 0 ? m.unit_reduce + g.unit_reduce : 0.0});
  // A mixture of experts: the last block's forward, at unpermute's sum, before the stage's output and
  // the head's tensors exist (optim/moe_activations.h; one process: this rank has the head).
  p.forward_extra = c.moe_experts > 0 && c.blocks > 0 ? moe_forward_bytes(c) - z.head - z.local + g.forward : 0;
  // Later micro-batches (gradient accumulation, or a pipeline stage whose
  // later ones run backward with its whole in-flight set): the first one's
  // .grad tensors are all alive (grad_bytes), and on a pipeline stage after
  // the first the gradient it sent back may still be in flight (an isend:
  // whether it is depends on when the previous stage receives it). Under
  // ZeRO-3 every micro-batch gathers and reduce-scatters alike, its units
  // beside each moment as in the first (the later ones' were left out: a
  // last stage measured one [b, s, h] above the formula when that isend
  // was still in flight at its second backward's peak).
  // A later micro-batch's backward runs with min(in flight, m - 1) kept: all
  // in flight in a steady state (m > in flight); where there is none (1F1B's
  // stage 0 at m = pp, AFAB) one fewer, its B after the first one's. Under
  // --recompute full a micro-batch keeps little, so that B with the .grad
  // tensors alive can be the peak (--pp 2 --layers 4 stage 0 fp32: +4.9%).
  const double later_kept = std::min(c.in_flight, double(c.micro_batches) - 1);
  ActivationPrediction q = p;  // the later backward, where it keeps fewer than the first
  if (later_kept > 0) {
    const double alive = double(c.grad_bytes) + (c.pp_stage && !c.has_embedding ? z.local : 0);
    // (A MoE block's experts walk counts each expert's new .grad tensors: a later backward sums into them.)
    ActivationCase accumulating = c;
    accumulating.grad_bytes = 0;
    const Moments n = c.moe_experts > 0 && c.grad_bytes > 0 ? backward_moments(accumulating, z) : m;
    const double later = c.zero3.on ? p.backward_moments
                                    : std::max({n.head, n.ln_f, n.block, c.swiglu ? n.gate : 0.0, n.ln_2,
                                                n.attention, n.rerun_collective, n.moe_rerun});
    ActivationPrediction& at = later_kept < c.in_flight ? q : p;
    at.backward_moments = std::max(at.backward_moments, later + alive);
    at.forward_extra += alive;
  }
  auto settle = [](ActivationPrediction& a, double kept_micro_batches) {  // the peak with that many kept
    a.backward_extra = std::max(a.backward_moments, a.forward_extra);
    a.total = kept_micro_batches * a.per_micro_batch + a.tokens + a.backward_extra;
  };
  settle(p, c.in_flight);
  if (later_kept > 0 && later_kept < c.in_flight) {
    settle(q, later_kept);
    if (q.total > p.total) p.total = q.total, p.backward_extra = q.backward_extra;
  }
  // ZeRO-3 under full recomputation: the block before the last reruns with one input fewer kept, beside
  // the last block's reduce-scatter in flight (larger than the head's): its own count, the larger taken.
  if (c.zero3.on && c.recompute == parallel::Recompute::Full && c.blocks > 1 && c.zero3.block_reduce > 0) {
    ActivationCase earlier = c;
    earlier.blocks -= 1;
    earlier.zero3.head_reduce = c.zero3.block_reduce, earlier.zero3.block_reduce = 0;
    earlier.zero3.last_block = c.zero3.earlier_block, earlier.zero3.before_last = c.zero3.before_earlier;
    earlier.zero3.resident = c.zero3.resident_rerun;
    earlier.zero3.pending_reduce = 0;  // an interleaved chunk's deferred one: waited for at the last block's
    const ActivationPrediction e = predict_activations(earlier);
    // On a pipeline stage without the head one block fewer leaves out the output gradient the stage received
    // (held until this micro-batch's backward returns) and each other micro-batch's last block input: in
    // flight x [b, s, h] (two blocks a stage: stage 0 was +5.5% fp32, +4.9% bf16 over this count).
    const double held = c.pp_stage && !c.has_head ? c.in_flight * z.local : 0;
    if (e.total + held > p.total) p.total = e.total + held, p.backward_extra = e.backward_extra;
  }
  p.held_until_w = held_until_w(c, z);
  p.split_extra = split_backward_extra(c, z, m);
  p.w_extra = weight_pass_extra(c, z);
  return p;
}

ActivationCase block_activation_case(const nn::GPTConfig& cfg, int64_t micro_batch, int64_t seq, int tp,
                                     bool sequence_parallel, int64_t element_bytes, parallel::Recompute recompute) {
  ActivationCase c;
  c.micro_batch = micro_batch, c.seq = seq, c.width = cfg.n_embd, c.heads = cfg.n_head;
  c.tp = tp, c.sequence_parallel = sequence_parallel, c.element_bytes = element_bytes, c.recompute = recompute;
  c.kv_heads = cfg.kv_heads(), c.mlp_hidden = cfg.ffn_hidden(), c.rmsnorm = cfg.rmsnorm, c.rope = cfg.rope;
  c.swiglu = cfg.swiglu, c.tied = cfg.tied_embeddings, c.bias = cfg.bias;  // the block's parts (--arch)
  c.moe_experts = cfg.moe.experts, c.moe_experts_per_token = cfg.moe.experts_per_token;  // the caller sets the group
  c.moe_shared_experts = cfg.moe.shared_experts;
  return c;
}

bool native_bf16_gemm(const Device& d) {
  return d.is_cuda() ? cuda::fast::use_lt(kBFloat16) : ops::bf16_gemm() == "bf16";
}

}  // namespace loom::optim
