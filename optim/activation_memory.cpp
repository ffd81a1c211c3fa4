#include "optim/activation_memory.h"

#include <algorithm>
#include <string>

#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

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

// The temporaries of a norm's backward (tensor/ops_nn.cpp, ops_llama.cpp)
// over R rows of width h. fp32: dx [R, h], dweight (and dbias) [h]. 16-bit:
// fp32 copies of the gradient, x and the weight, dx, dweight (and dbias) in
// fp32 and each rounded, all alive when it returns. RMSNorm has no bias.
double norm_backward_temporaries(double R, double h, double e, bool rmsnorm) {
  const double vectors = rmsnorm ? 1 : 2;  // dweight (and dbias)
  if (e == 4) return 4 * R * h + vectors * 4 * h;
  return (12 + e) * R * h + (4 + vectors * (4 + e)) * h;
}

}  // namespace

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

ActivationPrediction predict_activations(const ActivationCase& c) {
  const double b = double(c.micro_batch), s = double(c.seq), h = double(c.width), a = double(c.heads),
               t = double(c.tp), V = double(c.vocab), e = double(c.element_bytes);
  const bool native = c.native_bf16_gemm && c.element_bytes == 2;
  const double F = c.mlp_hidden > 0 ? double(c.mlp_hidden) : 4 * h;  // the MLP's width
  const double N = b * s;                                // tokens per micro-batch
  const double Ns = c.sequence_parallel ? N / t : N;     // of them in this rank's replicated regions
  const double unit = N * h * e;                         // one [b, s, h] tensor
  const double local = Ns * h * e;                       // one replicated [b, s, h] (sharded under SP)
  const double stats = c.rmsnorm ? Ns * 4 : 2 * Ns * 4;  // a norm's rows' 1/rms, or mean and 1/std, fp32
  const double mlp_kept = c.swiglu ? 4 * F : 2 * F;      // per token: gate, silu, up, product; or fc, gelu
  const double gathers = c.sequence_parallel && c.swiglu ? 2 : 1;  // ln_2's output as the MLP keeps it (units)
  // Split over tp, per token: q, k, v, the merged heads, the softmax, the MLP's.
  const double split = (attention_qkv_elements(c) + h + a * s + mlp_kept) / t;
  // x and h, and the norms' outputs; under SP x and h are sharded and each
  // column-parallel linear keeps the all-gathered input it made: SwiGLU's
  // c_gate and c_fc gather ln_2's output once each.
  const double replicated = c.sequence_parallel ? 2 / t + (c.swiglu ? 3 : 2) : 4;
  ActivationPrediction p;
  // Each norm also keeps its rows' statistics: two per block.
  p.per_block = unit * replicated + N * split * e + 2 * stats;
  // Recomputation (parallel/recompute.h) keeps less per block and rebuilds it
  // in backward: selective drops the attention core's softmax [b, a/t, s, s]
  // (q, k, v stay: they are its saved inputs); full keeps only the block's
  // input x (replicated, [b, s/t, h] under SP). What the rerun rebuilds is
  // added to the backward's moments below.
  const double block_kept = p.per_block;            // every activation of one block
  const double scores_kept = N * a * s / t * e;     // the softmax one block keeps
  if (c.recompute == parallel::Recompute::Selective) p.per_block -= scores_kept;
  if (c.recompute == parallel::Recompute::Full) p.per_block = local;
  // Around the blocks: the stage's output (the last block's, kept by ln_f or
  // for the pipeline's backward); the embedding's positions (s int64; none
  // with RoPE) and, split over tp, its N local ids (int64) and mask (fp32).
  const double embedding = c.has_embedding ? (c.rope ? 0 : 8 * s) + (c.tp > 1 ? 12 * N : 0) : 0;
  // The head: ln_f's output (gathered under SP: the linear keeps the full one),
  // ln_f's statistics, the fp32 logits the loss keeps [N, V'/t], and the
  // loss's per-row numbers in fp32 (log-sum-exp; with tp the max and the sum).
  const double logits = N * V / t * 4;
  const double head = c.has_head ? unit + stats + logits + (c.tp > 1 ? 2 : 1) * N * 4 : 0;
  p.per_micro_batch = double(c.blocks) * p.per_block + local + embedding + head;
  p.tokens = 2 * double(c.batch_tokens) * 8;  // the step's ids and targets, int64, on every rank

  // The head's wte gradient waits for the embedding's where one rank holds both ends of the tied wte.
  const double wte_grad = c.tied && c.has_head && c.has_embedding ? V / t * h * e : 0;
  // The backward's peak, above what is kept, at one of the moments (A) to (F) below; the largest counts.
  // (A) The head's backward, everything still kept: the loss's gradient of
  //     the logits (fp32; with tp also rounded to the model's dtype), or, once
  //     the logits are freed, that gradient in the model's dtype and the head
  //     linear's temporaries (x = ln_f's output [N, h], w = wte [V'/t, h]).
  double at_head = 0;
  if (c.has_head) {
    const double loss_grad = logits + (c.tp > 1 && e != 4 ? N * V / t * e : 0);
    const double head_linear = -(logits + (c.tp > 1 ? 2 : 1) * N * 4) + N * V / t * e +
                               linear_backward_temporaries(N, h, V / t, e, false, native);
    at_head = std::max(loss_grad, head_linear);
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
  double at_ln_f = 0;
  if (c.has_head) {
    const double freed = logits + (c.tp > 1 ? 2 : 1) * N * 4 + unit;
    at_ln_f = -freed + local + norm_backward_temporaries(Ns, h, e, c.rmsnorm) + wte_grad;
    if (c.sequence_parallel)
      at_ln_f = std::max(at_ln_f, -freed + 2 * unit + local + (e == 4 ? local : 4 * N * h + 4 * Ns * h) + wte_grad);
  }
  // (B) The last block's mlp.c_proj backward: the head's tensors and the
  //     stage's output are freed (on the stage with the head); alive are the
  //     gradient of the block's output (ln_f's, or the one received), under
  //     SP also its all-gathered copy, and c_proj's temporaries (x = the
  //     MLP's hidden [N, F/t], w [h, F/t]; its bias is inside the linear only
  //     without tp). Where one rank holds both ends of the tied wte, the
  //     head's wte gradient waits for the embedding's.
  // (B') SwiGLU: then the product's backward (silu(gate) * up): the product
  //     is freed; alive are c_proj's dx [N, F/t] and the two gradients it
  //     makes, [N, F/t] each. The peak for Llama's shapes in fp32.
  double at_block = 0, at_gate = 0;
  const double freed_head = c.has_head ? head + local : 0;
  if (c.blocks > 0) {
    at_block = -freed_head + local + (c.sequence_parallel ? unit : 0) +
               linear_backward_temporaries(N, F / t, h, e, c.bias && c.tp == 1, native) + wte_grad;
    if (c.swiglu) at_gate = -freed_head + local + 2 * N * F / t * e + wte_grad;
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
  double at_attention = 0;
  if (c.blocks > 0) {
    const double scores = N * a * s / t;  // [b, a/t, s, s] elements
    // Freed by now: the head and the stage's output, the block's h, ln_2's
    // output and statistics, the MLP's kept tensors, the merged heads.
    const double freed = freed_head + local + gathers * unit + stats + N * (mlp_kept + h) / t * e;
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
                              : native ? unit / t + scores * e + N * h / t * e
                                       : unit / t + scores * (e + 4) + N * h / t * (4 + 4 + e);
    const double received = c.has_head ? 0 : local;  // held by the pipeline, so the residual's sum is a new tensor
    // The fused op's backward (fp32 on the CPU): its incoming gradient and dq, dk, dv, [N, h/t] each.
    const double attention_bwd = c.fused_attention ? 4 * unit / t : std::max(softmax_bwd, matmul_bwd);
    at_attention = -freed + local + received + attention_bwd + wte_grad;
  }
  // (E) The last block's ln_2 backward: the MLP's tensors and ln_2's output
  //     (under SP its gathered copies) are freed; alive are the residual
  //     gradient, the gradient of ln_2's output (no tp: c_fc's dx [N, h]; tp:
  //     its all-reduced sum [N, h]; SP: its reduce-scattered [Ns, h]) and
  //     the norm's backward temporaries (16-bit: on fp32 copies). The peak
  //     of full recomputation under tp in 16-bit, with native GEMMs.
  double at_ln_2 = 0;
  if (c.blocks > 0)
    at_ln_2 = -freed_head + local + wte_grad - N * mlp_kept / t * e - gathers * unit +
              (c.sequence_parallel ? local : unit) + norm_backward_temporaries(Ns, h, e, c.rmsnorm);
  // (F) Full recomputation under tp: the rerun's forward runs the block's
  //     collectives inside backward. At the last one, the MLP's all-reduce
  //     (SP: reduce-scatter), the rerun holds all the block keeps but its
  //     output, not yet made (under SP also ln_2's sharded output, a
  //     temporary of the forward's expression), and the collective's
  //     tensors: c_proj's partial sums [N, h] and their sum (SP: a copy laid
  //     out for the reduce-scatter and the result [Ns, h]); 16-bit reduces
  //     in fp32 buffers (parallel/comm: [N, h], and SP's result [Ns, h]);
  //     fp32 SP, in place, peaks after it: the result laid back out [Ns, h].
  double at_rerun_collective = 0;
  if (c.blocks > 0 && c.tp > 1 && c.recompute == parallel::Recompute::Full) {
    const double sp = c.sequence_parallel ? local : 0;
    at_rerun_collective = -freed_head + local + wte_grad + block_kept - local + sp + 2 * unit + sp +
                          (e == 4 ? sp : 4 * N * h + (c.sequence_parallel ? 4 * Ns * h : 0));
  }
  // The last block's backward runs inside its rerun (autograd/checkpoint.h),
  // which holds the rerun's output and the gradient it came with until its
  // backward ends. Selective: at (C) the core's rerun has rebuilt the
  //   softmax, and holds its output and that output's gradient, [b, a/t, s,
  //   hd] each; (B) comes before it.
  // Full: at (B) and (C) the whole block is rebuilt - every activation but x,
  //   which the rerun shares with the kept input - and its output (replicated)
  //   is held: block_kept - local + local. At (C) the block's output gradient
  //   is held too (on a stage without the head the pipeline holds it already).
  if (c.recompute == parallel::Recompute::Selective) at_attention += scores_kept + 2 * unit / t;
  if (c.recompute == parallel::Recompute::Full) {
    at_block += block_kept, at_attention += block_kept + (c.has_head ? local : 0);
    if (c.swiglu) at_gate += block_kept;
    at_ln_2 += block_kept;
  }
  // Without a main_grad buffer (fp32, dp 1, no ZeRO) backward keeps .grad
  // tensors (fp32): at (B), ln_f's weight (and bias), the head's own wte
  // (untied, or on a rank without the embedding) and, with tp, c_proj's bias
  // (outside the linear); at (B') also c_proj's weight; at (C) also the
  // MLP's, ln_2's and attn.c_proj's.
  const bool grads_kept = c.grad_bytes > 0;
  const double norm_weights = c.rmsnorm ? h : 2 * h;
  const double head_weight = c.has_head && (!c.tied || !c.has_embedding) ? V / t * h * 4 : 0;
  // The MLP's matrices, and its column-parallel ones (their biases split over tp).
  const double mlp_matrices = c.swiglu ? 3 : 2, mlp_columns = c.swiglu ? 2 : 1;
  double grads_at_block = grads_kept && c.blocks > 0
      ? (c.has_head ? norm_weights * 4 : 0) + head_weight + (c.tp > 1 && c.bias ? h * 4 : 0)
      : 0;
  double grads_at_gate = grads_kept && c.swiglu && c.blocks > 0
      ? grads_at_block + 4 * (h * F / t + (c.bias && c.tp == 1 ? h : 0))
      : 0;
  double grads_at_mlp = grads_kept && c.blocks > 0  // (E): the MLP's weights (and biases) too
      ? grads_at_block + 4 * (mlp_matrices * h * F / t + (c.bias ? mlp_columns * F / t + (c.tp > 1 ? 0 : h) : 0))
      : 0;
  double grads_at_attention = grads_kept && c.blocks > 0  // (C): ln_2's and attn.c_proj's too
      ? grads_at_mlp + 4 * (norm_weights + h * h / t + (c.bias ? h : 0))
      : 0;
  double grads_at_rerun = grads_kept ? (c.has_head ? norm_weights * 4 : 0) + head_weight : 0;  // (F): the head's
  // Full recomputation with .grad tensors: each later block whose backward
  // has run leaves its gradients (12 h²/t + 7 h/t + 6 h for GPT-2, fp32) and
  // frees only its input (one replicated unit); when those gradients are the
  // larger, the peak moves to the FIRST block's rerun, blocks - 1 such blocks later.
  if (c.recompute == parallel::Recompute::Full && grads_kept && c.blocks > 1) {
    const double kv = kv_width(c);
    const double matrices = (2 * h * h + 2 * h * kv + mlp_matrices * h * F) / t;
    const double biases = c.bias ? (h + 2 * kv + mlp_columns * F) / t + 2 * h : 0;
    const double block_grads = 4 * (matrices + biases + 2 * norm_weights);
    const double later = double(c.blocks - 1) * std::max(0.0, block_grads - local);
    grads_at_block += later;
    grads_at_attention += later, grads_at_mlp += later, grads_at_rerun += later;
    if (c.swiglu) grads_at_gate += later;
  }
  const double grads_at_ln_f = grads_kept ? head_weight : 0;  // the head's own wte
  p.backward_extra = std::max({at_head, at_ln_f + grads_at_ln_f, at_block + grads_at_block,
                               c.swiglu ? at_gate + grads_at_gate : 0.0, at_ln_2 + grads_at_mlp,
                               at_attention + grads_at_attention, at_rerun_collective + grads_at_rerun});
  // Later micro-batches (gradient accumulation, or a pipeline stage whose
  // later ones run backward with its whole in-flight set): the first one's
  // .grad tensors are all alive (grad_bytes), and on a pipeline stage after
  // the first the gradient it sent back may still be in flight (an isend:
  // whether it is depends on when the previous stage receives it).
  if (double(c.micro_batches) > c.in_flight) {
    const double sent = c.pp_stage && !c.has_embedding ? local : 0;
    p.backward_extra = std::max(p.backward_extra, std::max({at_head, at_ln_f, at_block, c.swiglu ? at_gate : 0.0,
                                                            at_ln_2, at_attention, at_rerun_collective}) +
                                                      double(c.grad_bytes) + sent);
  }
  p.total = c.in_flight * p.per_micro_batch + p.tokens + p.backward_extra;
  return p;
}

double micro_batches_in_flight(const char* schedule, int64_t micro_batches, int pp, int stage, int virtual_stages) {
  const double m = double(micro_batches);
  if (pp <= 1) return 1;  // gradient accumulation: one micro-batch at a time
  if (std::string(schedule) == "afab") return m;
  // ZB-H1 (zero_bubble_schedule.h): up to p on every stage, from F to W (W keeps X and dY).
  if (std::string(schedule) == "zb-h1") return std::min(m, double(pp));
  if (virtual_stages <= 1) return std::min(m, double(pp - stage));
  // Interleaved (interleaved_schedule.cpp): warm-up forwards of single chunks, then the first backward.
  const int64_t total = micro_batches * virtual_stages;
  const int64_t warmup = micro_batches == pp ? total
                                             : std::min<int64_t>((pp - stage - 1) * 2 + (virtual_stages - 1) * pp, total);
  return double(std::min<int64_t>(warmup + 1, total)) / virtual_stages;
}

ActivationPrediction predict_activations_interleaved(const ActivationCase& c, const std::vector<ChunkActivations>& chunks,
                                                     int pp, int stage) {
  // Each chunk as a stage of its own: its bytes per micro-batch, and its
  // backward's temporaries the first time and later (with its own .grad
  // tensors alive). Not a pipeline stage: the gradient in flight is counted below.
  std::vector<ActivationPrediction> first, later;
  for (const ChunkActivations& k : chunks) {
    ActivationCase one = c;
    one.blocks = k.blocks, one.has_head = k.has_head, one.has_embedding = k.has_embedding, one.grad_bytes = k.grad_bytes;
    one.in_flight = 1, one.micro_batches = 1, one.pp_stage = false;
    first.push_back(predict_activations(one));
    one.micro_batches = 2;
    later.push_back(predict_activations(one));
  }
  // The input gradient an earlier backward sent (any chunk but the first
  // virtual stage's): an isend that may still be in flight, [b s h] (/ t under SP).
  const double sent = double(c.micro_batch * c.seq) / (c.sequence_parallel ? c.tp : 1) * double(c.width) *
                      double(c.element_bytes);
  ActivationPrediction p;
  p.tokens = first.front().tokens;
  std::vector<bool> ran(chunks.size(), false);  // chunk k's backward has run: its .grad tensors are alive
  bool sending = false;
  double kept = 0;
  for (const parallel::ScheduledOp& op : parallel::interleaved_order(pp, stage, int(chunks.size()),
                                                                     int(c.micro_batches))) {
    const size_t k = size_t(op.chunk);
    if (op.kind == 'F') {
      kept += first[k].per_micro_batch;
      continue;
    }
    double extra = (ran[k] ? later[k] : first[k]).backward_extra + (sending ? sent : 0);
    for (size_t j = 0; j < chunks.size(); ++j) extra += ran[j] && j != k ? double(chunks[j].grad_bytes) : 0;
    if (kept + extra > p.total) p.total = kept + extra, p.backward_extra = extra, p.per_micro_batch = kept;
    kept -= first[k].per_micro_batch;
    ran[k] = true;
    sending = sending || !chunks[k].has_embedding;
  }
  p.total += p.tokens;
  return p;
}

bool native_bf16_gemm(const Device& d) { return !d.is_cuda() && ops::bf16_gemm() == "bf16"; }

}  // namespace loom::optim
