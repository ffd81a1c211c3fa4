// What one rank's activations cost at their peak, counted tensor by tensor
// from loom's GPT (nn/block.h, nn/attention.h, nn/mlp.h; the tp versions in
// parallel/tensor_parallel/block.cpp): --memory-report's "activ. peak" row
// prints the allocator's measurement beside this.
//
// What backward keeps, per block and micro-batch, in units of b s h elements
// (b sequences, s tokens, h width, a heads, t tp ranks; loom has no dropout
// masks and keeps activations in the model's dtype):
//
//   kept by                  tensor                          units
//   ln_1, ln_2               their inputs x and h            2        replicated over tp
//   c_attn, c_fc             the layernorms' outputs         2        replicated (with SP: gathered, full)
//   q kᵀ, att v              q, k, v (views of c_attn's out) 3 / t    split over heads
//   att v                    softmax(q kᵀ)  [b, a, s, s]     a s / (h t)
//   c_proj                   the merged heads                1 / t
//   gelu, mlp.c_proj         c_fc's output, gelu's output    8 / t    split over 4h
//   per block                                                4 + (12 + a s / h) / t
//   (with sequence parallelism x and h are sharded: 2 / t + 2 + (12 + a s / h) / t)
// and ln_1, ln_2 each keep their rows' mean and 1/std, [b s] fp32 (/ t with SP).
//
// Korthikanti et al. 2022 (Table 2) count the same tensors in 16-bit bytes as
// 34 + 5 a s / h: theirs adds the dropout masks and counts bytes, not elements.
//
// Llama's blocks (--arch llama; each part is a GPTConfig option, and the
// count follows the options): what differs, per token (F the MLP's width,
// kv = Hkv h / a the k and v width, all but the norms' / t):
//   RMSNorm          1/rms only: one [b s] fp32 statistic a norm, not two
//   RoPE             q and k rotated into new tensors [N, h], [N, kv]
//   repeat_kv (GQA)  new k, v [N, h] when a rank repeats more than one kv
//                    head; one kv head (MQA, or Hkv / t = 1) repeats as a
//                    stride-0 view. c_attn's output [N, h + 2 kv] stays
//                    while q, k or v is a view of it:
//                      no RoPE, kv = h (GPT-2)   3h   c_attn's output
//                      RoPE, kv = h              5h   it, q', k'
//                      RoPE, copies              3h   q', k, v repeated
//                      RoPE, one kv head         2h + 3 kv: it, q', k'
//   SwiGLU           gate, silu(gate), up, their product: 4F (GELU: 2F = 8h)
//   under SP         c_gate and c_fc each all-gather ln_2's output and keep
//                    their copy: 3 full units replicated, not 2
//   untied head      its lm_head's gradient is its own .grad tensor
//   no wpe           no positions kept
// per block: 4 + (attention's q, k, v + h + a s + 4F or 2F) / t units, and
// the two norms' statistics. Measured = formula to the byte (+ the loss's
// scalars, 8-12 bytes) on tests/test_memory_ledger.cpp's llama modes and on
// --layers 2 --heads 4 --embd 64 --block 32 --batch 16 --arch llama, kv heads
// 1, 2 and 4, fp32, bf16 and fp16, --tp 2 (fp32; bf16; SP bf16; kv 2 and 4),
// --dp 2, --grad-accum 2, --pp 2 bf16, --recompute full and selective (fp32,
// bf16, tp 2 bf16, tp 2 SP bf16); --heads 8 --embd 32 --block 64 --batch 2
// (C) fp32, bf16 kv 1, 2, 8, tp 2. (fp32 under SP reduce-scatters in place,
// and peaks when the result is laid back out: at (D), and in (F) below.)
//
// Around the blocks, per micro-batch: the stage's output (the last block's,
// kept for the pipeline's backward or by ln_f) 1 unit, replicated; on the
// stage with the embedding its positions [s] int64 (with tp also the local
// ids [b s] int64 and their mask, fp32); on the stage with the head ln_f's
// output (full) 1 unit, its mean and 1/std, the fp32 logits the loss keeps
// [b s, V'/t] (V' the vocab padded for tp) and the loss's per-row fp32
// numbers (log-sum-exp; with tp the max and the sum). Once per step, on every
// rank: the global batch's ids and targets, int64.
//
// Micro-batches in flight at the peak: 1 without a pipeline (gradient
// accumulation frees one micro-batch before the next); AFAB all m; 1F1B
// min(m, p - stage) (Narayanan et al. 2021, section 2.2: stage s runs p - s
// forwards before its first backward); interleaved 1F1B has no one count
// (predict_activations_interleaved, optim/pipeline_activations.h, walks its schedule instead).
//
// The peak is in a backward (found by recording, at each new peak of the
// allocator, the live blocks and the autograd node that allocated each), at
// one of these moments of the last block and the head; the largest counts:
//   (A) the head's backward, all of the above still kept: the loss's fp32
//       gradient of the logits while the logits live; or, once they are
//       freed, that gradient (in the model's dtype) and the head linear's
//       backward temporaries. The peak when V' / t is large against h.
//   (D) ln_f's backward: the head's tensors are freed; alive are the
//       gradient of ln_f's output, the layernorm's backward temporaries
//       (16-bit: on fp32 copies) and the head's wte gradient; under SP,
//       just before, the reduce-scatter of that gradient (16-bit: in fp32
//       buffers). The peak for bf16 with native GEMMs (below), whose (B) is small.
//   (B) the last block's mlp.c_proj backward: the head's tensors and the
//       stage's output are freed; alive are the gradient of the block's
//       output (ln_f's, or the one received), with SP also its all-gathered
//       copy, c_proj's backward temporaries and, where one rank holds both
//       ends of the tied wte, the head's wte gradient, waiting for the
//       embedding's. The peak for GPT-like shapes.
//   (B') SwiGLU's product backward, after (B): the product is freed; alive
//       are c_proj's dx and the two gradients it makes, [N, F/t] each. The
//       peak for Llama's shapes in fp32.
//   (E) the last block's ln_2 backward: the MLP's tensors are freed; alive
//       the gradient of ln_2's output (all-reduced under tp) and the norm's
//       fp32 temporaries.
//   (C) the last block's softmax backward: the MLP's tensors are freed too;
//       alive are the softmax's incoming gradient and its result, each
//       [b, a, s, s] (16-bit: with fp32 copies), and v's gradient; v itself
//       is freed if nothing else holds it (Llama's repeated or rotated
//       copies). The peak when a s / h is large (many heads, long
//       sequences). fp32 on the CPU runs the fused attention op, whose
//       backward makes only dq, dk, dv [N, h/t] (no [b, a, s, s] temporaries).
// A Linear's backward (tensor/ops_linear.cpp), x [M, K], w [n, K], e the
// dtype's bytes: fp32 makes dx [M, K] and dW [n, K] (and a bias's column sums,
// in double then fp32); 16-bit kernels work on fp32 copies: the gradient's
// [M, n], dx in fp32 then rounded, x's [M, K], dW in fp32 then rounded:
// 4 M n + (4 + e) (M K + n K) at once. That is why a 16-bit stage needs more
// than half of the fp32 one's bytes. bf16 on a CPU that multiplies it
// natively (native_bf16_gemm: tensor/cpu/gemm_bf16.h) makes no fp32 copies:
// dx and dW in bf16, e (M K + n K), like fp32 at half the bytes; and att @ v's
// backward reads attᵀ and its gradient as they are.
// Without a main_grad buffer (fp32, dp 1, no ZeRO) backward keeps the params'
// .grad tensors (4 N bytes): those whose backward has run by (B) or (C).
// When later micro-batches run backward with the whole in-flight set
// (gradient accumulation; a pipeline stage with m > in flight), all of them
// are alive, and on the stages after the first so is the first micro-batch's
// input gradient, sent by an isend that may still be in flight: counted, so
// the formula is the peak with it; measured is that gradient less when the
// isend completed first.
//
// Measured / formula - 1 (the allocator's peak against this; the formula
// leaves out the loss's fp32 scalars, 8 to 12 bytes): +0.0% on every rank of
//   the nine modes of tests/test_memory_ledger.cpp;
//   --layers 2 --embd 64 --heads 2 --block 16 --batch 4 (B): fp32, bf16,
//     fp16, --grad-accum 2, --pp 2 (m 2 and 4, fp32; m 2 and 4 bf16; AFAB
//     m 4; with --dp 2 --zero bf16), --tp 2 (fp32, bf16, SP fp32); --layers
//     4 --heads 4 --block 32 --pp 2 --microbatches 4;
//   --embd 32 --batch 8 on a 140-letter vocabulary (A): fp32, bf16, --dp 2,
//     --tp 2, --tp 2 SP bf16;
//   --embd 32 --heads 8 --block 64 --batch 2 (C): fp32, bf16, --dp 2,
//     --grad-accum 2, --tp 2 (fp32, bf16, SP bf16), --pp 2 (fp32; bf16 m 4;
//     with --tp 2; AFAB m 3);
// except a pipeline's last stage whose isend completed first: -2.7% (the
// test's pp2 fp16; other runs +0.0%), -5.7% (pp2 tp2 fp32), -2.5% (--embd 64
// --pp 2 fp32), -2.2% (bf16), -1.8% (--layers 4), -1.7% / -3.1% (--heads 8
// --pp 2, with --tp 2).
// Interleaved 1F1B (the schedule walk; the average in-flight count it replaces was +2.1% / +58% off), --pp 2
// --virtual-stages 2 unless said: measured = formula (+0.0%, the bf16 stage 0s +0.01%) on every rank of --layers
// 4 --embd 64 --batch 4 at m 2, of --layers 8 --pp 4 m 4 and of --dp 2 m 4 bf16 --zero; on the other runs some
// ranks measure the formula less the one sent gradient, whose isend had completed: m 4 fp32 -0.8 / -0.7, bf16
// and fp16 -0.8 on stage 1, v 3 -0.6, --pp 4 m 8 -0.4 to -0.8, --dp 2 -1.0, --tp 2 -1.2 / -1.3, --tp 2 SP bf16
// -0.7, --heads 8 --block 64 (C) -0.5, --embd 32 -0.8 to -2.0. Once above it: --dp 2 m 2 bf16 --zero, one stage
// 1 rank +1.1% (two sent gradients and a header still held: a send's payload is released when the channel's
// thread sees it complete, which can be after the receiver has it).
// Zero bubble (--schedule zb-h1, zb-v, dualpipev): the same walk with the split backward's terms
// (optim/split_backward.h). ZB-H1: measured = formula (+ the loss's scalars) on every stage of the default model
// at pp 4, m 4 and 8, b 2 and 4, fp32 and bf16, and tests/test_memory_ledger_zero_bubble.cpp's runs, --arch llama
// too. The V (zb-v, dualpipev), as ZB-H1, lets go of each send at the first op that knows it arrived
// (parallel/pipeline_parallel/send_release.h), and the walk counts what a send holds until then: an input gradient
// past its W, and on each link the first send's 80-byte header. Measured = formula (+ the loss's scalars) on every
// stage of tests/test_memory_ledger_zero_bubble.cpp's V runs (pp 2, 3, 4, fp32 and bf16) and of the default model
// at pp 2, m 4, b 4: ZB-V 10.84 / 19.69 MiB on stages 0 / 1, DualPipeV 11.20 / 21.94. Before, a send let go of its
// payload when a later send found it delivered (timing): stage 0 measured up to a gradient above the formula (zb-v
// pp 2: B1.1's, alive past W1.1 to B2.1's peak), at pp 3 up to 1.3: the rest was DualPipeV's stage 0 peaking in
// the embedding chunk's B (split_backward.h), not counted then. The V's stage 0 holds the tied wte in both chunks:
// one .grad tensor (train/diagnostics.cpp gives it to the head's chunk, whose W runs first); counted once per
// chunk, the formula was 6004 bytes above the test model's peak. Not modelled: --recompute full under a split
// backward (measured 1.4-7.8% above: what the reruns' graphs keep until W).
// Recomputation (--recompute, parallel/recompute.h): selective keeps each
// block's tensors but its softmax, 4 + 12 / t units; full keeps only the
// block's input, 1 unit ([b, s/t, h] under SP: 1 / t). Backward then
// rebuilds one block at a time: full adds the last block's whole per-block
// bytes (and the rerun's held output) to moments (B) and (C), selective adds
// the softmax and the core's held output and its gradient to (C). With
// .grad tensors (no main_grad buffer) full's peak moves to the FIRST block's
// rerun when a block's gradients outweigh its input. Measured / formula - 1:
// +0.0% for none / selective / full on --layers 2 --embd 32 --heads 2 --block
// 16 at --batch 8 and 16, --layers 3, --embd 64, --heads 4, bf16, fp16;
// --heads 8 --block 64 --batch 2 (C) bf16 and fp16; --dp 2; --tp 2 (fp32;
// selective bf16); --tp 2 SP (fp32; selective bf16); --pp 2 fp16 (its last
// stage the isend gap above, -2.7%); --pp 2 --layers 4 fp32, bf16, m 4, AFAB
// and --pp 4 --layers 8 m 4 on every stage (fp32 stage 0 peaks in its second
// backward, one micro-batch kept and the .grad tensors alive: was +4.9%, pp 4
// +6.3%). Full recomputation under tp: the
// rerun's forward runs the block's collectives inside backward, so two more
// moments: (F) the rerun's last collective, the MLP's all-reduce (SP:
// reduce-scatter), with the rerun's block but its output, c_proj's partial
// sums and their sum (SP: the laid-out copy and the [Ns, h] result) and, in
// 16-bit, the collective's fp32 buffers; and (E) above, in the rerun. They
// were the +4.7% (--tp 2 bf16, (E)) and +15.1% (SP, (F)) the formula missed;
// now measured = formula: tests/test_memory_ledger.cpp's tp2_bf16_full and
// tp2_sp_bf16_full, and the Llama and --heads 8 --block 64 runs above.
// ZeRO-3's: optim/zero3_activations.h; context parallelism's ring: optim/ring_activations.h. Not modelled: dropout's masks
// (none at p = 0); the CUDA backend (no fp32 copies; its caching allocator not measured).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "optim/zero3_activations.h"
#include "parallel/recompute.h"
#include "tensor/device.h"

namespace loom::optim {

struct ActivationCase {
  int64_t micro_batch = 1;   // b
  int64_t seq = 1;           // s
  int64_t width = 1;         // h
  int64_t heads = 1;         // a
  int64_t vocab = 1;         // V' (padded to a multiple of tp)
  int64_t blocks = 0;        // transformer blocks on this rank, all chunks
  bool has_head = false;     // this rank computes the logits and the loss
  bool has_embedding = false;// this rank computes the embedding (with has_head: it holds both ends of the tied wte)
  int64_t batch_tokens = 0;  // the step's global batch, rows x s: every rank samples its ids and targets
  int tp = 1;
  int cp = 1;                // --cp: ring attention in the core's place (optim/ring_activations.h)
  bool sequence_parallel = false;
  int64_t element_bytes = 4; // the model's dtype
  bool native_bf16_gemm = false;  // bf16 GEMMs read and write bf16 (native_bf16_gemm below): no fp32 copies
  double in_flight = 1;      // micro-batches whose activations are kept at the peak
  bool pp_stage = false;     // a pipeline stage (pp > 1): sends and receives gradients
  int64_t micro_batches = 1; // m per step
  int64_t grad_bytes = 0;    // the params' .grad tensors, when there is no main_grad buffer (else 0)
  parallel::Recompute recompute = parallel::Recompute::None;  // --recompute (parallel/recompute.h)
  // The block's parts (nn/gpt.h's GPTConfig): GPT-2's by default, Llama's
  // with --arch llama (the Llama table above says what each keeps).
  int64_t kv_heads = 0;      // key/value heads (0: heads); grouped-query attention below heads
  int64_t mlp_hidden = 0;    // the MLP's width F (0: 4h)
  bool rmsnorm = false;      // RMSNorm: keeps 1/rms only (LayerNorm: mean and 1/std)
  bool rope = false;         // rotary q, k (new tensors), no learned positions
  bool swiglu = false;       // SwiGLU: gate, silu, up and their product kept (GELU: fc, gelu)
  bool tied = true;          // the head reads wte (else its own lm_head)
  bool bias = true;          // biases on the attention and MLP linears
  bool fused_attention = false;  // the CPU's fused causal attention (nn/attention.h's attend(): fp32 or fp64,
                                 // no dropout): its backward makes dq, dk, dv and no [b, a, s, s] temporaries
  // A mixture of experts in the MLP's place (nn/moe.h; optim/moe_activations.h); mlp_hidden: an expert's I.
  int64_t moe_experts = 0, moe_experts_per_token = 0, moe_shared_experts = 0;  // E (0: the dense MLP), k, S
  double moe_kept_rows = 0, moe_last_rows = 0;  // a capacity's kept rows M: blocks' mean, last block's (0: N k)
  int64_t rerun_blocks_after = -1;  // --recompute full: done blocks past the last of `blocks` (-1: all alike)
  int64_t moe_largest_group = 0;  // the most rows one expert computed in the last block (the routing's)
  int moe_ep = 1;  // --ep: the rows this rank's E / ep experts got from the ep group (last micro-batch):
  double moe_received_rows = 0;           // R per block (their mean over the blocks)
  std::vector<int64_t> moe_local_groups;  // [E / ep] per local expert, in the last block
  Zero3Held zero3;  // ZeRO-3's units and gradients beside the activations (optim/zero3_activations.h)
};

// Whether bf16 GEMMs on device d read bf16 operands as they are (no fp32 copies): on the CPU,
// ops::bf16_gemm()'s switch; on a GPU, the cuBLASLt path (tensor/cuda/fast/gemm_lt.h, under
// LOOM_CUDA_KERNELS=fast), where the reference widens them to fp32 (tensor/cuda/gemm.cpp).
bool native_bf16_gemm(const Device& d);

struct ActivationPrediction {
  double per_block = 0;      // bytes, one block, one micro-batch
  double per_micro_batch = 0;// bytes kept per micro-batch on this rank (blocks + around them)
  double tokens = 0;         // bytes of the step's ids and targets
  double backward_extra = 0; // bytes of the backward's temporaries on top, at its peak
  // Of it: (U), the last MoE block's forward, and the backward's moments (with micro_batches > in_flight
  // the later micro-batches', the earlier ones' .grad tensors and sent gradient alive): a pipeline walk's.
  double forward_extra = 0, backward_moments = 0;
  double total = 0;          // in_flight x per_micro_batch + tokens + backward_extra
  // Split backward (zero bubble, optim/split_backward.h): what one micro-batch
  // holds from its B to its W, B's temporaries above what is kept, W's.
  double held_until_w = 0;
  double split_extra = 0;
  double w_extra = 0;        // W's temporaries above what is held
};

ActivationPrediction predict_activations(const ActivationCase& c);

// The case's block from the model's config (its width, heads and Llama parts):
// micro_batch sequences of seq tokens (T / cp under context parallelism), over
// tp, in element_bytes, with recompute. The rank's blocks and ends, the
// vocabulary, the batch and the schedule are the caller's to set.
ActivationCase block_activation_case(const nn::GPTConfig& cfg, int64_t micro_batch, int64_t seq, int tp,
                                     bool sequence_parallel, int64_t element_bytes, parallel::Recompute recompute);

// A pipeline rank walked through its own schedule (interleaved 1F1B, ZB-H1, the V's): optim/pipeline_activations.h.

}  // namespace loom::optim
