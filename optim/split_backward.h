// The zero-bubble schedules' activations (--schedule zb-h1, zb-v, dualpipev):
// their backward runs in two pieces (autograd/engine.h), B (input gradients)
// then, later, W (weight gradients). What a micro-batch holds between them,
// and what its B needs above what is kept, differ from the unsplit backward's.
//
// Between B and W a micro-batch holds the work B left (WeightGrads): each
// separable linear's closure keeps its X and its dY, dY being a gradient the
// unsplit backward freed as soon as the linear's backward ran; the gradients
// B computed for the weights that are not separable (the norms') wait for W
// too. Per block, e the dtype's bytes, kv the k and v width, F the MLP's:
//   c_attn      X ln_1's output [b s, h] (gathered under SP)   dY [b s, (h + 2 kv)/t]
//   attn.c_proj X the merged heads [b s, h/t]                  dY [b s, h]
//   c_fc        X ln_2's output [b s, h] (SwiGLU's c_gate too)  dY [b s, F/t] (c_gate's too)
//   mlp.c_proj  X gelu's output [b s, F/t]                     dY [b s, h]
//   ln_1, ln_2  their weight and bias gradients [h] each (RMSNorm: weight only)
// GPT-2 (kv = h, F = 4h, t = 1): 7 units of X and 9 of dY, 16 [b, s, h]
// units, against the 17 + a s / h the block keeps until B. On the stage with
// the head: its linear's X, ln_f's output [b s, h], and dY, the logits'
// gradient [b s, V'/t] in e bytes, and ln_f's gradients. On the stage with
// the embedding: the token embedding's dY [b s, h] and, with learned
// positions, the position embedding's [s, h]. On every stage but the first:
// the stage's input and its gradient (the one sent back), [b s/t, h] each,
// which the X's autograd graph reaches (the input's AccumulateGrad holds it).
//
// B's own peak: the unsplit backward's moments (activation_moments.h) with
// the linears' dW temporaries gone and, at each moment, what the linears
// already run hold for W (split_backward_extra). W's: its first dW, made
// while the whole micro-batch is still held (weight_pass_extra).
#pragma once

#include "optim/activation_moments.h"

namespace loom::optim {

// Bytes one micro-batch holds from its B to its W (the table above).
double held_until_w(const ActivationCase& c, const Sizes& z);

// B's peak above what the micro-batch keeps until B, given the unsplit
// backward's moments m. No .grad tensors: W makes them (the caller adds those
// of the W's already run).
double split_backward_extra(const ActivationCase& c, const Sizes& z, const Moments& m);

// W's peak above what is held: its first piece (the head's linear, else the
// last block's mlp.c_proj, else the token embedding), with everything held.
double weight_pass_extra(const ActivationCase& c, const Sizes& z);

}  // namespace loom::optim
