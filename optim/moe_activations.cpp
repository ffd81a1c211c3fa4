#include "optim/moe_activations.h"

#include <algorithm>

namespace loom::optim {

namespace {

struct MoESizes {
  double N, k, M, E, I, C, e, router;  // router: the router's element bytes (fp32 for 16-bit models)
  explicit MoESizes(const ActivationCase& c)
      : N(double(c.micro_batch * c.seq)), k(double(c.moe_experts_per_token)), M(N * k), E(double(c.moe_experts)),
        I(double(c.mlp_hidden)), C(double(c.width)), e(double(c.element_bytes)), router(c.element_bytes == 2 ? 4 : e) {}
};

}  // namespace

double moe_kept_bytes(const ActivationCase& c) {
  const MoESizes z(c);
  const double router = z.router * (z.N * z.E + z.N * z.k + z.N) + z.e * z.N * z.k;  // probs, picked, sum; weights
  const double indices = 8 * (z.N * z.k + z.M + z.N * z.k);
  const double rows = z.e * (z.M * z.C + 4 * z.M * z.I + (z.M + 1) * z.C + z.N * z.k * z.C);
  return router + indices + rows;
}

double moe_backward_bytes(const ActivationCase& c) {
  const MoESizes z(c);
  // (M) unpermute's backward: the weighting's (each slot's row's gradient, the product for the weights'
  // gradient, its float64 sum and result), or index_select's (index_add: its source in fp32 - a copy for
  // 16-bit - its fp32 sum over the rows + a zero row, rounded into a new tensor for 16-bit)
  const double NkC = z.N * z.k * z.C, rows = (z.M + 1) * z.C;
  const double unpermute = std::max(2 * z.e * NkC + (8 + z.e) * z.N * z.k,
                                    4 * NkC + 4 * rows + (z.e == 4 ? 0 : z.e * rows));
  const double group = double(c.moe_largest_group);
  const double experts = z.e * (2 * group * z.I - 2 * z.M * z.C - 2 * z.M - z.C);
  return std::max(unpermute, experts);
}

double moe_forward_bytes(const ActivationCase& c) {
  const MoESizes z(c);
  // the experts' output [M, C] and the logits [N, E] the forward holds; the weighted slots [N, k, C],
  // the sum's float64 accumulator [N, C] and its result [N, C]
  return z.e * z.M * z.C + z.e * z.N * z.E + z.e * z.N * z.k * z.C + 8 * z.N * z.C + z.e * z.N * z.C;
}

}  // namespace loom::optim
