// What a mixture-of-experts block (nn/moe.h) keeps for backward and what its
// backward adds at its peak, in place of the dense MLP's terms of
// optim/activation_memory.h; --memory-report's "activ. peak" for --experts.
// N tokens, k experts each, M = N k rows (dropless), E experts of width I, C
// the width, e the model's bytes; the router works in fp32 for 16-bit models.
//
//   kept by                     tensor                                     bytes
//   softmax                     probs [N, E]                               4 N E (e for fp32)
//   the renormalisation         the picked probs [N, k], their sum [N, 1]  4 (N k + N)
//   unpermute's weighting       the weights [N, k]                         e N k
//   gather, permute, unpermute  the chosen experts, each row's token and   8 (N k + M + N k)
//                               each slot's row, int64 indices
//   each expert's w1 and w3     the permuted rows [M, C]                   e M C
//   each expert's SwiGLU        gate, silu, up, product [M, I]             4 e M I
//   unpermute's gather          its input, the rows + a zero row [M + 1, C] e (M + 1) C
//   unpermute's weighting       each slot's row [N, k, C]                  e N k C
// (measured = this to the byte on one layer, fp32: N 256-512, C 32-64, E 1-8,
// k 1-2, I 88-1024).
//
// Backward, the last block first, relative to what is kept (fp32):
//   (M) unpermute's backward: the gradient of each slot's row [N, k, C] and of
//       the rows [M + 1, C] (index_select's, a scatter into zeros), and the
//       weights' [N, k] with its indices: 2 e N k C + 12 N k
//   (X) the largest group's SwiGLU backward (its M_g rows): w2's dx and the
//       product's two gradients [M_g, I] each, the product freed, less what
//       unpermute's backward freed by then (each slot's row, the rows + zero
//       row, the weights): e (2 M_g I - 2 M C - 2 M - C)
// (measured = these on one layer with its params' .grad tensors made before).
// Not counted yet: in train_gpt the peak of a MoE model is in the last block's
// FORWARD, at unpermute's weighted sum (found by recording the allocation that
// made each new peak): the [N, k, C] product, the sum's accumulator and
// result, and the experts' output [M, C] the layer's forward still holds,
// before the head's tensors exist. The formula is 2-3% under the measurement
// there (tests/test_memory_ledger_moe.cpp); that moment is the next term.
#pragma once

#include "optim/activation_memory.h"

namespace loom::optim {

// Bytes one MoE block keeps per micro-batch, what the table above lists.
double moe_kept_bytes(const ActivationCase& c);

// The MoE block's backward at its peak above what is kept: the larger of (M) and (X).
double moe_backward_bytes(const ActivationCase& c);

}  // namespace loom::optim
