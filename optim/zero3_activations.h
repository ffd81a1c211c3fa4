// What ZeRO-3 (parallel/data_parallel/fully_sharded.h) holds beside the
// activations at each moment of optim/activation_memory.h: the "activ. peak"
// the allocator measures during forward and backward counts these bytes too,
// since none of them exists before the step or after it.
//
//   gathered units   each unit's full params [P_u] (model dtype) from its
//                    all-gather to its reshard: the layer computing, the
//                    next one prefetched (forward: the layer after it;
//                    backward: the layer before it), and the units held
//                    through the step (the embedding's, where the head
//                    reads its tied wte)
//   .grad tensors    a unit's params' gradients, in the model's dtype, from
//                    their backward until the unit's last one arrives (then
//                    flattened and dropped): those of the layer in backward
//   a reduce-scatter the unit's flattened gradient [P_u] fp32 and its shard
//                    [P_u / dp] fp32, from its launch until the next unit's
//                    (one in flight at a time): in the last block's backward
//                    the head's; under --ep, from the MoE block's backward
//                    on, its experts' (their own unit, over expert-dp)
//
// At the moments where a mixture of experts (optim/moe_activations.h) or a
// dense model peaks, on one stage holding every layer (a pipeline stage: its
// own layers, the head's only on the last, no layer before its first block
// but the embedding on the first; the last stage's tied wte copy is a unit of
// its own, whose reduce-scatter is in flight at (D) in its gathered copy's
// and .grad's place):
//   (U) the last block's forward   its units + the head's (prefetched)
//   (A) the loss's backward        the head's units (the loss is outside the head layer)
//   (A), (D) the head's backward   the head's units + the last block's (prefetched);
//                                  at (D) the head linear's .grad
//   (B), (M), (X), (B')            the last block's units + the one before's
//                                  (prefetched) + the head's reduce-scatter
//                                  + the block's .grad tensors so far
//   (E), (C), and the reruns       the same; under --ep its experts' reduce-scatter
//                                  in the head's place, their .grad gone
//   (R) its unit's reduce-scatter  the last block's units + the one before's, all
//                                  its .grad tensors and its flattened gradient
//                                  [P] fp32 (the head's reduce-scatter done), the
//                                  block's activations let go but its input
//                                  gradient (and a received one)
//   (R') the block before it,      its units + the one before's, its .grad tensors
//        at its c_attn's (or then  but ln_1's, the last block's reduce-scatter
//        ln_1's) backward          still in flight; of the activations, what
//                                  that backward reads and makes
// + the held units throughout. Without prefetch no second unit is gathered.
// (R) and (R') peak where a unit outweighs a block's activations: wide blocks at
// few tokens (--embd 256 --batch 2: the formula was 27% under without (R), 32%
// with three blocks without (R'); a mixture of experts at I 512 and 128 tokens
// a micro-batch, 15%). Under --recompute full the block's kept input stays
// (the checkpoint's), the rebuilt block is let go by (R), and three [b, s, h]
// are alive: the rerun's output and the gradient it came with (the checkpoint
// holds both until its backward ends) and the input gradient just made; at
// (R') the last block's input is let go, and of those the earlier block's
// rerun output and gradient and the residual's gradient, and on a stage
// without the head the received gradient, held by the pipeline. Measured =
// formula in fp32 and bf16 (and --recompute selective and full: 2, 3 and 4
// blocks, Llama, prefetch off, reshard after forward off, --pp 2 with 2 and
// 3 blocks a stage, interleaved, bf16 GEMMs native or through fp32; without
// these the full runs were 19.8% (2 blocks) and 4.9% (3 blocks) under the
// measurement). In 16-bit with native GEMMs (R')'s peak is a step later, at
// ln_1's backward, whose fp32 copies outweigh c_attn's bf16 temporaries
// (0.48% under without it: dp 2, --embd 256 --batch 2 --layers 3).
// Without reshard after forward (FSDP2's reshard_after_forward=False) a unit
// is resharded only after its backward: from the last block's forward on,
// every layer's units before it are gathered too (at (U) and the head's
// moments the last block's and the one before's whether prefetched or not;
// in a block's backward the one before it and all earlier ones). Under a
// pipeline each micro-batch's forward gathers again what the backward before
// it resharded, so its backward sees the same (the drain's, fewer).
// Under --recompute full the block before the last reruns beside the last
// block's reduce-scatter, [P_b] + [P_b / dp] fp32, far larger than the head's:
// with one input fewer kept, its rerun is the peak (predict_activations counts
// both; was +1.6% fp32, +15.7% bf16 under the measurement, dense, dp 2).
// Interleaved 1F1B (--virtual-stages, predict_activations_interleaved's walk): each chunk counts its own
// units as a stage would (prefetch stays inside a chunk), and two things cross chunks: (1) a chunk's units
// gathered from its forward to its backward (`between`: the rank's last layer's, which after_forward keeps;
// without reshard after forward all of them) stand beside the other chunks' backwards in between; (2) a
// chunk's last micro-batch syncs under defer_grad_sync, so its last reduce-scatter (its first layer's own
// unit) is still in flight through the next backward until that one launches its first (pending_reduce).
// Measured = formula (or less the one sent gradient) on every rank of --dp 2 --pp 2 --virtual-stages 2
// --layers 4, m 2 and 4, fp32 and bf16, prefetch off, reshard after forward off (and --layers 8),
// --recompute selective and full (and --layers 8, bf16), and at 8 ranks beside --tp 2 (full recomputation
// in bf16; sequence parallelism), --cp 2 and HSDP (--dp 4 --dp-shard 2). Without `between` stage 0 measured
// +5.8% above (m 4; reshard off, --layers 8: +3.0%); counting the deferred reduce-scatter in the earlier block's rerun
// too (the last block's own waited for it) put the formula 9.7% (fp32), 18% (bf16) above stage 1.
// Measured = formula: tests/test_memory_ledger_moe.cpp's ZeRO-3 runs.
#pragma once

#include <cstddef>

namespace loom::parallel {
class FullyShardedDataParallel;
}

namespace loom::optim {

// ZeRO-3's bytes beside the activations, from the units of this rank (train/diagnostics.cpp reads them off
// FullyShardedDataParallel): `on` false without ZeRO-3.
struct Zero3Held {
  bool on = false;
  bool prefetch = true;       // the next unit gathered while this one computes
  // --zero3-reshard-after-forward off: each layer's units stay gathered from its forward to its backward, so
  // at every moment those of the layers before the one before the last block too (resident; under
  // --recompute full, the earlier block's rerun: before the one before it, resident_rerun).
  bool reshard_after_forward = true;
  double resident = 0, resident_rerun = 0;
  double held = 0;            // units gathered through the step (the tied wte's, read by the head)
  double head = 0;            // the head layer's units (but the held ones), full, model dtype
  double last_block = 0;      // the last block's units (under --ep its experts' unit too)
  double before_last = 0;     // the layer before the last block's (the embedding's with one block)
  double head_reduce = 0;     // the head unit's gradient in its reduce-scatter: [P] + [P / dp] fp32
  double experts_reduce = 0;  // --ep: the last block's experts' unit's, alike over expert-dp (0: no such unit)
  // --recompute full: the block before the last reruns beside the last block's reduce-scatter in flight
  // (its (dense) unit's, in the head's place), its own units gathered and the layer before it prefetched.
  double block_reduce = 0, earlier_block = 0, before_earlier = 0;
  double first = 0;  // the embedding's units (but the held ones): prefetched by the first block's backward
  // A pipeline's last stage: the tied wte's copy is a unit of its own (fully_sharded.h's own_units), the
  // head's one param: gathered with the head; at ln_f's backward (D) its gradient is already in its
  // reduce-scatter ([P] + [P / dp] fp32), its .grad dropped and its params resharded.
  double head_own = 0, head_own_reduce = 0;
  // An interleaved pipeline (--virtual-stages): a chunk's backward that syncs (its last micro-batch's) defers
  // the wait for its last reduce-scatter, its first layer's (last_reduce), to the next backward's first
  // reduce-scatter. Beside that backward's moments until then: pending_reduce ([P] + [P / dp] fp32 or 0).
  double last_reduce = 0, pending_reduce = 0;
  // The chunk's units gathered from its forward to its backward: beside the other chunks' backwards in between.
  double between = 0;
};

// ZB-H1's split backward (optim/split_backward.h): B makes no .grad and launches no reduce-scatter (W
// does, and reshards each unit then), so every unit B gathers stays gathered through B: at its head moments
// the head's units (and, once the head layer's backward began, the last block's prefetched), at its last
// block's moments the head's beside the last block's and the one before's (prefetched); each earlier block
// adds its own (split_backward.cpp's zero3_earlier_blocks). Measured = formula (but the loss's 8 bytes) on
// every rank of --dp 2 --pp 2 (and --pp 3), fp32 and bf16, m 2 and 4, --layers 2, 4, 6 and 8, prefetch
// off, reshard after forward off, Llama, --recompute selective (tests/test_memory_ledger_zero_bubble.cpp);
// without these terms stage 0 measured 7.7% above the formula (--layers 2, fp32), 7.4% below it (bf16, m 4,
// --layers 4, where the formula counted fp32 .grad tensors instead). W's candidate counts no units: B, which
// ends with every unit of the stage gathered, measured above W's first dW on every stage.
struct Zero3InB {
  double loss = 0;   // (A) the loss's backward, before the head layer's
  double head = 0;   // the head linear's and ln_f's
  double block = 0;  // the last block's moments
};
Zero3InB zero3_in_b(const Zero3Held& u, bool has_head);

// Read off the units of a rank: [embedding, blocks, head], or a pipeline stage's part of them; of an
// interleaved rank, one chunk's: its layers [first_layer, end_layer) of the rank's.
Zero3Held zero3_held(const parallel::FullyShardedDataParallel& fsdp, bool has_embedding = true, bool has_head = true,
                     size_t first_layer = 0, size_t end_layer = size_t(-1));

}  // namespace loom::optim
