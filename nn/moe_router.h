// The router of a mixture-of-experts layer (Mixtral's top-k gate): each token
// picks its k experts and the weights their outputs are mixed with.
//   logits  = x @ gateᵀ                 x [N, C], gate [E, C] -> [N, E]
//   probs   = softmax(logits)           [N, E], fp32 (as transformers' MixtralTopKRouter)
//   chosen  = top-k of probs (+ bias)   [N, K] int64, the choice; no gradient
//   weights = probs[chosen] / Σ_k       [N, K], renormalised over the k chosen
// The weights carry the gradient back into the gate: d weights / d probs through
// the gather and the renormalisation, then softmax's backward (gradient-checked
// in tests/test_moe.cpp).
// DeepSeek-V3's auxiliary-loss-free balancing (arXiv:2412.19437, §2.1.2): a
// per-expert bias is added to the scores for the choice only; the weights are
// still the unbiased probabilities. The choice is made on the host: the group
// sizes it yields must reach the host anyway to cut the experts' batches
// (Megatron's dropless dispatcher synchronises at the same point).
#pragma once

#include "tensor/tensor.h"

namespace loom::nn {

struct RouterOutput {
  Tensor logits;   // [N, E], the gate's output (the z-loss reads it)
  Tensor probs;    // [N, E], softmax over the experts (the aux loss reads it)
  Tensor chosen;   // [N, K] int64 on the host, each row's experts by descending score
  Tensor weights;  // [N, K], probs at chosen, renormalised to sum 1 over each row
};

// x: [N, C], gate_weight: [E, C]; score_bias: [E] fp32, or undefined (no bias).
RouterOutput route_top_k(const Tensor& x, const Tensor& gate_weight, int64_t k, const Tensor& score_bias = Tensor());

// The k largest of scores [N, E] (+ bias [E]) per row, by descending score,
// ties to the lower expert index: [N, K] int64 on the host. No gradient.
Tensor top_k_experts(const Tensor& scores, int64_t k, const Tensor& score_bias = Tensor());

}  // namespace loom::nn
