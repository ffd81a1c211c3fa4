#include "nn/moe_aux_loss.h"

#include <vector>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {
double g_backward_scale = 1.0;
}

void set_aux_loss_backward_scale(double loss_scale, int64_t micro_batches) {
  LOOM_CHECK(micro_batches >= 1, "set_aux_loss_backward_scale: ", micro_batches, " micro-batches");
  g_backward_scale = loss_scale / double(micro_batches);
}
double aux_loss_backward_scale() { return g_backward_scale; }

Tensor load_balancing_loss(const Tensor& probs, const Tensor& chosen) {
  const int64_t N = probs.size(0), E = probs.size(1);
  std::vector<double> f(size_t(E), 0.0);  // the fraction of the N tokens routed to each expert
  for (int64_t e : ops::contiguous(chosen).to_vector<int64_t>()) f[size_t(e)] += 1.0;
  for (double& fe : f) fe /= double(N);
  return load_balancing_loss(probs, f);
}

Tensor load_balancing_loss(const Tensor& probs, const std::vector<double>& f) {
  using namespace autograd;
  const int64_t E = probs.size(1);
  LOOM_CHECK(int64_t(f.size()) == E, "load_balancing_loss: ", f.size(), " fractions for ", E, " experts");
  const Tensor fraction = ops::to(from_vector(f, {E}), probs.device(), probs.dtype());  // [E], a constant
  const Tensor P = mean(probs, {0});                                                   // [E]
  return sum(P * fraction) * double(E);
}

Tensor router_z_loss(const Tensor& logits) {
  using namespace autograd;
  // logsumexp = m + log Σ exp(l - m), m the row max (a constant shift: no gradient through it)
  const Tensor m = ops::max(logits.alias(), 1, /*keepdim=*/true).first;      // [N, 1]
  const Tensor lse = log(sum(exp(logits - m), {1})) + ops::squeeze(m, 1);  // [N]
  return mean(lse * lse);
}

Tensor attach_aux_loss(const Tensor& x, const Tensor& aux, double coef) {
  return autograd::record("MoEAuxLossAutoScaler", {&x, &aux}, x, [aux, coef](const autograd::TensorList& g) {
    return autograd::TensorList{g[0], full({}, coef * g_backward_scale, aux.dtype(), aux.device())};
  });
}

}  // namespace loom::nn
