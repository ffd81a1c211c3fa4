// The router's auxiliary losses, and how their gradient joins backward.
//   load balancing (Switch, arXiv:2101.03961, and GShard; Mixtral's form, as
//     transformers' load_balancing_loss_func):  E · Σ_e f_e · P_e, where over
//     the micro-batch's N tokens f_e = (slots routed to e) / N (no gradient; Σ f_e = K)
//     and P_e = mean_n probs[n, e]. Its minimum, K, is at a uniform load.
//   z-loss (ST-MoE, arXiv:2202.08906):  mean_n logsumexp(logits[n])², which keeps
//     the router's logits small.
// Each MoE layer adds coef · its losses to the model's loss (Megatron sums them
// over layers). A layer's aux loss is not an output of the model: like
// Megatron's MoEAuxLossAutoScaler, attach_aux_loss passes the activations on
// unchanged and, in backward, seeds the aux loss's own graph with coef times
// the scale the main loss's gradient carries (1/micro-batches, times fp16's
// loss scale), which the training loop sets before each step.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

// probs: [N, E], chosen: [N, K] int64 (host) -> [] (probs' dtype)
Tensor load_balancing_loss(const Tensor& probs, const Tensor& chosen);
// The same with f_e given, [E]: over a micro-batch whose other tokens other
// ranks hold (nn/moe.h's TokenShards), P_e still over probs' N tokens.
Tensor load_balancing_loss(const Tensor& probs, const std::vector<double>& fraction);

// logits: [N, E] -> []
Tensor router_z_loss(const Tensor& logits);

// Returns x unchanged; backward adds coef · backward_scale · d aux to the aux loss's graph.
Tensor attach_aux_loss(const Tensor& x, const Tensor& aux, double coef);

// Before a step of `micro_batches` forwards whose losses are each multiplied by
// loss_scale / micro_batches (the mean over micro-batches, fp16's loss scale):
// the aux losses' gradient gets the same factor, so an aux loss counts as much
// in each micro-batch as the main loss does. Megatron's forward_step:
// MoEAuxLossAutoScaler.set_loss_scale(grad_scale / num_microbatches).
void set_aux_loss_backward_scale(double loss_scale, int64_t micro_batches);
double aux_loss_backward_scale();

}  // namespace loom::nn
