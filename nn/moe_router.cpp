#include "nn/moe_router.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "autograd/functions.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::nn {

Tensor top_k_experts(const Tensor& scores, int64_t k, const Tensor& score_bias) {
  NoGradGuard no_grad;
  const int64_t N = scores.size(0), E = scores.size(1);
  LOOM_CHECK(1 <= k && k <= E, "top_k_experts: k ", k, " must be in [1, ", E, "] (the number of experts)");
  const std::vector<double> s = ops::to(ops::contiguous(scores), kCPU, kFloat64).to_vector<double>();
  std::vector<double> bias(size_t(E), 0.0);
  if (score_bias.defined()) bias = ops::to(score_bias, kCPU, kFloat64).to_vector<double>();
  std::vector<int64_t> chosen(static_cast<size_t>(N * k)), order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const double* row = s.data() + n * E;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return row[a] + bias[size_t(a)] > row[b] + bias[size_t(b)]; });
    std::copy_n(order.begin(), k, chosen.begin() + n * k);
  }
  return from_vector(chosen, {N, k});
}

RouterOutput route_top_k(const Tensor& x, const Tensor& gate_weight, int64_t k, const Tensor& score_bias) {
  using namespace autograd;
  LOOM_CHECK(x.dim() == 2 && gate_weight.dim() == 2 && x.size(1) == gate_weight.size(1), "route_top_k: tokens ",
             x.shape(), " and gate ", gate_weight.shape(), " (expected [N, C] and [E, C])");
  RouterOutput r;
  r.logits = linear(x, gate_weight, Tensor());                                      // [N, E]
  r.probs = softmax(is_half(x.dtype()) ? to(r.logits, kFloat32) : r.logits);   // bf16/fp16: in fp32, as HF
  r.chosen = top_k_experts(r.probs, k, score_bias);                               // [N, K] host
  Tensor picked = gather(r.probs, 1, ops::to(r.chosen, r.probs.device()));      // [N, K]
  r.weights = to(picked / sum(picked, {1}, /*keepdim=*/true), x.dtype());        // renormalised over the k
  return r;
}

}  // namespace loom::nn
