#include "optim/moe_activations.h"

#include <algorithm>
#include <numeric>

#include "optim/activation_moments.h"

namespace loom::optim {

namespace {

// M: the rows the routing kept, N k dropless; with a capacity (--capacity-factor) the routing's own
// count, the blocks' mean for what the blocks keep (`mean`), else the last block's, whose moments peak.
// The shared experts' SwiGLU (nn/mlp.h, tp's cut of it) runs over the b s tokens of a tp rank (tokens), S I / t
// wide (shared_F); under sequence parallelism c_gate and c_fc each keep ln_2's output gathered [b s, C] (gathered).
struct MoESizes {
  double N, k, M, E, I, C, e, router;  // router: the router's element bytes (fp32 for 16-bit models)
  bool native;                         // bf16 GEMMs without fp32 copies
  double tokens, shared_F, gathered;
  explicit MoESizes(const ActivationCase& c, bool mean = false)
      : N(double(c.micro_batch * c.seq) / (c.sequence_parallel ? c.tp : 1)), k(double(c.moe_experts_per_token)),
        M(mean ? (c.moe_kept_rows > 0 ? c.moe_kept_rows : N * k) : (c.moe_last_rows > 0 ? c.moe_last_rows : N * k)),
        E(double(c.moe_experts)), I(double(c.mlp_hidden)), C(double(c.width)), e(double(c.element_bytes)),
        router(c.element_bytes == 2 ? 4 : e), native(c.native_bf16_gemm && c.element_bytes == 2),
        tokens(double(c.micro_batch * c.seq)), shared_F(double(c.moe_shared_experts) * I / double(c.tp)),
        gathered(c.sequence_parallel && c.tp > 1 ? 2 * e * tokens * C : 0) {}
};

// (X) walked: this rank's experts' backward, the last one first (cat's backward), each a candidate at
// its SwiGLU's product backward (2 e M_j I) and at its w2's backward (its temporaries: 16-bit GEMMs on
// fp32 copies make this the larger). base: what (X) has freed by then; under ep less the 8 R bytes of
// the unsort's indices (the combine's index_select backward has run; 8 bytes more alive, measured).
// Each expert done frees its 4 [M_j, I]; after the first, its input's gradient [R, C] is being summed,
// and the last frees the experts' output gradient, of which each w2's dY was a view: under ep the
// unsort's [R, C], on one process unpermute's [M + 1, C] (R = M there). The .grad tensors: under
// ZeRO-3 each expert's stay (the model's dtype) until its unit is reduce-scattered, after the last;
// without a main_grad buffer (fp32 .grad) for the rest of backward: its w2's by its product's
// backward, and all three of each expert done before it (on one process at I 512 they were the 0.8%
// the largest group's count alone missed).
//
// split (zero bubble's B, optim/split_backward.h): each linear makes its dx only and holds its X and dY
// until W, so an expert's product (w2's X) outlives its backward, which peaks with w2's dx and the
// product's two gradients (3 e M_j I, or w2's dx temporaries); each expert done frees its gate, silu and
// up but holds w1's and w3's dY (1 [M_j, I] less); the output gradient stays (w2's dY); W makes the
// .grad tensors.
double local_experts_backward(const ActivationCase& c, const MoESizes& z, double base, bool split = false) {
  const std::vector<int64_t>& g = c.moe_local_groups;  // [E / ep] rows per local expert
  const double R = std::accumulate(g.begin(), g.end(), 0.0);  // the rows this rank's experts received
  const bool ep = c.moe_ep > 1;
  // (K) before them, the unsort's backward (index_add into [R, C]): the combine's gradient [R, C], brought
  // home by its all-to-all, and index_add's sum [R, C] fp32; 16-bit adds on an fp32 copy of the source and
  // rounds the sum into a new tensor (the peak of dp 2 ep 2 bf16's rerun, --recompute full).
  const double unsort =
      ep ? base + z.e * R * z.C + 4 * R * z.C + (z.e == 4 ? 0 : 4 * R * z.C + z.e * R * z.C) : base;
  const double output_grad = ep ? z.e * R * z.C : z.e * (z.M + 1) * z.C;
  base += ep ? -8 * (R - 1) : output_grad;  // (under ep the unsort's count has it)
  const double matrix_grad = split ? 0 : c.zero3.on ? z.e * z.I * z.C : c.grad_bytes > 0 ? 4 * z.I * z.C : 0;
  double freed = 0, best = std::max(base, unsort);
  for (size_t j = g.size(); j-- > 0;) {
    const bool first = j + 1 == g.size(), last = j == 0 && !split;
    const double alive = base - freed + (first ? 0 : z.e * R * z.C) - (last ? output_grad : 0), M_j = double(g[j]);
    if (split) {
      best = std::max(
          {best, alive + 3 * z.e * M_j * z.I, alive + linear_dx_temporaries(M_j, z.I, z.C, z.e, z.native)});
      freed += z.e * M_j * z.I;
      continue;
    }
    best = std::max({best, alive + 2 * z.e * M_j * z.I + matrix_grad,
                     alive + linear_backward_temporaries(M_j, z.I, z.C, z.e, false, z.native)});
    freed += 4 * z.e * M_j * z.I - 3 * matrix_grad;
  }
  return best;
}

// (M) unpermute's backward: the weighting's (each slot's row's gradient, the product for the weights'
// gradient, its float64 sum and result), or index_select's (index_add: its source in fp32 - a copy for
// 16-bit - its fp32 sum over the rows + a zero row, rounded into a new tensor for 16-bit).
double unpermute_backward(const MoESizes& z) {
  const double NkC = z.N * z.k * z.C, rows = (z.M + 1) * z.C;
  return std::max(2 * z.e * NkC + (8 + z.e) * z.N * z.k, 4 * NkC + 4 * rows + (z.e == 4 ? 0 : z.e * rows));
}

// What unpermute's backward has freed when the experts' begins: its input [M + 1, C], the slots [N, k, C]
// and an int64 [N k] index (M = N k dropless; with a capacity M is the kept rows, the slots N k still).
double experts_base(const MoESizes& z) { return -z.e * ((z.M + 1) * z.C + z.N * z.k * z.C) - 8 * z.N * z.k; }

// The shared experts' kept tensors: gate, silu, up and their product [b s, S I / t] each, and the gathered inputs.
double shared_kept_bytes(const ActivationCase& c, const MoESizes& z) {
  return c.moe_shared_experts == 0 ? 0 : 4 * z.e * z.tokens * z.shared_F + z.gathered;
}

}  // namespace

double moe_kept_bytes(const ActivationCase& c, bool last_block) {
  const MoESizes z(c, /*mean=*/!last_block);
  const double router = z.router * (z.N * z.E + z.N * z.k + z.N) + z.e * z.N * z.k;  // probs, picked, sum; weights
  const double indices = 8 * (z.N * z.k + z.M + z.N * z.k);
  const double rows = z.e * (z.M * z.C + 4 * z.M * z.I + (z.M + 1) * z.C + z.N * z.k * z.C);
  if (c.moe_ep > 1) {  // the received rows R in the permuted ones' place: arrived, grouped, computed, 2 indices
    // R: the blocks' mean (what they all keep), or the last block's own, its local groups' sum (the block
    // whose moments peak, the one --recompute full's rerun rebuilds)
    double R = c.moe_received_rows;
    if (last_block && !c.moe_local_groups.empty())
      R = std::accumulate(c.moe_local_groups.begin(), c.moe_local_groups.end(), 0.0);
    return router + indices + 16 * R + z.e * (3 * R * z.C + 4 * R * z.I + (z.M + 1) * z.C + z.N * z.k * z.C) +
           shared_kept_bytes(c, z);
  }
  return router + indices + rows + shared_kept_bytes(c, z);
}

double moe_held_until_w(const ActivationCase& c, bool output_gradient) {
  const MoESizes z(c, /*mean=*/true);
  const double R = c.moe_ep > 1 ? c.moe_received_rows : z.M;  // the rows this rank's experts computed
  // The router's gate: its dY, the logits' gradient [N, E] (X is ln_2's output, the caller's).
  const double gate = z.e * z.N * z.E;
  // Each expert's w1 and w3: X its rows (views of the permuted [R, C]), dY [R_j, I] each; w2: X the
  // product [R_j, I], dY [R_j, C], views of the experts' output gradient: on one process unpermute's
  // [M + 1, C] (its zero row's too), under ep the unsort's [R, C].
  const double experts = z.e * (2 * R * z.C + (c.moe_ep > 1 ? 0 : z.C) + 3 * R * z.I);
  if (c.moe_shared_experts == 0) return gate + experts;
  // The shared experts, a dense SwiGLU cut over tp: c_gate's and c_fc's X (ln_2's output, gathered under
  // SP: 2 copies) and dY [b s, S I / t] each; c_proj's X, the product [b s, S I / t], and dY [b s, C], the
  // block's output gradient (counted here if output_gradient).
  return gate + experts + z.gathered + z.e * z.tokens * (3 * z.shared_F + (output_gradient ? z.C : 0));
}

double moe_backward_bytes(const ActivationCase& c) {
  const MoESizes z(c);
  const double unpermute = unpermute_backward(z);
  const double group = double(c.moe_largest_group);
  // (X) after unpermute's backward
  const double base = experts_base(z);
  // Walked where the routing's groups are known (the runs' own); the largest alone otherwise (the planner's).
  const double experts =
      !c.moe_local_groups.empty() ? local_experts_backward(c, z, base) : base + 2 * z.e * group * z.I;
  if (c.moe_shared_experts == 0) return std::max(unpermute, experts);
  // The shared experts' backward runs first (the sum's second input): their c_proj's and their product's,
  // as a dense SwiGLU's (B) and (B'), with c_proj's .grad tensor where there is no main_grad buffer. Then
  // the routed moments above, with the shared experts' tensors freed, their input gradient [N, C] waiting
  // for the routed one's and (no main_grad buffer) their three .grad tensors alive.
  const double tokens = z.tokens, F = z.shared_F;
  // one matrix's .grad: fp32 without a main_grad buffer, the model's dtype under ZeRO-3 (until its unit's reduce)
  const double grad = c.grad_bytes > 0 ? 4 * F * z.C : c.zero3.on ? z.e * F * z.C : 0;
  const double c_proj = linear_backward_temporaries(tokens, F, z.C, z.e, false, z.native);
  const double product = 2 * z.e * tokens * F + grad;
  const double after = -shared_kept_bytes(c, z) + z.e * z.N * z.C + 3 * grad;
  return std::max({c_proj, product, unpermute + after, experts + after});
}

double moe_split_backward_bytes(const ActivationCase& c) {
  const MoESizes z(c);
  const double routed = std::max(unpermute_backward(z), local_experts_backward(c, z, experts_base(z), true));
  if (c.moe_shared_experts == 0) return routed;
  // The shared experts first, as moe_backward_bytes', split: c_proj's B makes its dx alone, and its X, the
  // product, outlives the product's backward (3 [b s, S I / t]); once done their gate, silu and up are
  // freed, the product and c_gate's and c_fc's dY held, their input gradient [N, C] waiting for the routed
  // one's. No .grad tensors: W makes them.
  const double held = z.gathered + 3 * z.e * z.tokens * z.shared_F;  // c_gate's and c_fc's X and dY, the product
  const double c_proj = linear_dx_temporaries(z.tokens, z.shared_F, z.C, z.e, z.native);
  const double product = 3 * z.e * z.tokens * z.shared_F;
  const double after = -shared_kept_bytes(c, z) + held + z.e * z.N * z.C;
  return std::max({c_proj, product, routed + after});
}

double moe_forward_bytes(const ActivationCase& c) {
  const MoESizes z(c);
  // the experts' output [M, C] and the logits [N, E] the forward holds; the weighted slots [N, k, C],
  // the sum's float64 accumulator [N, C] and its result [N, C]
  const double permuted = c.moe_ep > 1 ? z.e * z.M * z.C : 0;  // under ep kept by no one, but alive until forward ends
  // (U) comes before the shared experts' forward: what they keep does not exist yet.
  const double unpermute = z.e * z.M * z.C + z.e * z.N * z.E + z.e * z.N * z.k * z.C + 8 * z.N * z.C +
                           z.e * z.N * z.C + permuted - shared_kept_bytes(c, z);
  if (c.moe_shared_experts == 0) return unpermute;
  // (S) the routed and shared outputs' sum, all kept: the experts' output [M, C] and the logits [N, E],
  // still held by the forward, the routed output, the shared one and their sum [N, C].
  const double held = z.e * z.M * z.C + z.e * z.N * z.E + permuted;
  const double sum = held + 3 * z.e * z.N * z.C;
  if (c.tp == 1) return std::max(unpermute, sum);
  // (S) under tp: before it, the shared c_proj's collective (activation_moments.cpp's (F), a dense MLP's):
  // beside the routed output [N, C], its partial sums [b s, C] and their sum (SP: a copy laid out for the
  // reduce-scatter and its result [N, C]); 16-bit reduces in fp32 buffers ([b s, C], SP's result [N, C]),
  // fp32 SP lays the result back out [N, C].
  const bool sp = c.sequence_parallel;
  const double T = z.tokens, local = z.e * z.N * z.C;
  const double collective = held + local + 2 * z.e * T * z.C + (sp ? local : 0) +
                            (z.e == 4 ? (sp ? local : 0) : 4 * T * z.C + (sp ? 4 * z.N * z.C : 0));
  return std::max({unpermute, sum, collective});
}

}  // namespace loom::optim
