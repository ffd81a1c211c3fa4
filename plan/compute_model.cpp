#include "plan/compute_model.h"

#include <algorithm>

#include "plan/memory_model.h"
#include "plan/moe_model.h"

namespace loom::plan {

double layer_forward_flops(const ModelShape& m) {
  const double s = double(m.seq), h = double(m.width);
  // GPT-2: s (24 h² + 4 s h); a mixture of experts: the weights a token passes (plan/moe_model.h)
  return s * (2 * active_block_matmul_params(m) + 4 * s * h);
}

// What backward reruns: every layer's forward (full), or each layer's
// attention core, q kᵀ and att v, 4 s² h a sequence (selective).
double recompute_forward_flops(const ModelShape& m, const Grid& g, double layers_fwd) {
  if (g.recompute) return layers_fwd;
  if (!g.recompute_selective) return 0;
  const double s = double(m.seq), h = double(m.width);
  return layers_fwd / layer_forward_flops(m) * 4 * s * s * h;
}

double head_forward_flops(const ModelShape& m) { return 2.0 * double(m.seq) * double(m.width) * double(m.vocab); }

double model_flops_per_step(const ModelShape& m, const Grid& g, const Batch& b) {
  const double sequences = double(g.dp) * double(b.micro_batch) * double(b.micro_batches);
  return 3 * sequences * (double(m.layers) * layer_forward_flops(m) + head_forward_flops(m));
}

double rank_flops_per_s(const Machine& mc, const Grid& g) {
  // every rank computes at one device's (one core's) rate; sharing is step_time's cores bound
  return mc.peak_tflops(g.dtype) * 1e12 * mc.efficiency;
}

StageCompute stage_compute(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage) {
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  double layers_fwd = 0, head_fwd = 0;
  for (int64_t i : items) {
    if (i >= 1 && i <= m.layers) layers_fwd += layer_forward_flops(m);
    if (i == m.layers + 1) head_fwd += head_forward_flops(m);
  }
  // Per micro-batch, this tp rank's share of the math.
  const double per_rank = double(b.micro_batch) / g.tp / g.cp;
  const double fwd = (layers_fwd + head_fwd) * per_rank;
  const double bwd = 2 * fwd + recompute_forward_flops(m, g, layers_fwd) * per_rank;
  const double rate = rank_flops_per_s(mc, g);
  return {fwd / rate, bwd / rate, fwd + bwd};
}

}  // namespace loom::plan
