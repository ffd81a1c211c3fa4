#include "plan/cp_model.h"

#include <algorithm>

#include "plan/compute_model.h"
#include "plan/memory_model.h"

namespace loom::plan {

double kv_block_elements(const ModelShape& m, const Grid& g, const Batch& b) {
  return 2.0 * double(b.micro_batch) * double(m.seq) / g.cp * double(m.kv_width()) / g.tp;
}

RingOverlap ring_overlap(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc) {
  RingOverlap o;
  if (g.cp <= 1) return o;
  const Link link = link_for_span(mc, int64_t(g.tp) * g.cp);
  const double K = kv_block_elements(m, g, b), d = dtype_bytes(g.dtype), rate = rank_flops_per_s(mc, g);
  const double h = double(m.width), kv = double(m.kv_width());
  o.chunk_tokens = double(m.seq) / (2.0 * g.cp);
  o.min_chunk_tokens = d * kv * rate / (2 * h * link.bytes_per_s);
  o.step_fwd_s = 8 * double(b.micro_batch) * o.chunk_tokens * o.chunk_tokens * h / g.tp / rate;
  o.step_bwd_s = 2 * o.step_fwd_s;
  o.hop_fwd_s = send_seconds(K * d, link);
  o.hop_bwd_s = send_seconds(K * d + K * 4, link);
  const double steps = g.cp - 1;
  const double fwd = steps * std::max(0.0, o.hop_fwd_s - o.step_fwd_s);
  const double bwd = steps * std::max(0.0, o.hop_bwd_s - o.step_bwd_s) + send_seconds(K * 4, link);
  o.exposed_s = fwd + bwd + (g.recompute || g.recompute_selective ? fwd : 0);
  return o;
}

namespace {

double blocks_on_stage(const ModelShape& m, const Grid& g, int stage) {
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  return double(std::count_if(items.begin(), items.end(), [&](int64_t i) { return i >= 1 && i <= m.layers; }));
}

}  // namespace

double cp_exposed_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage) {
  return g.cp <= 1 ? 0 : blocks_on_stage(m, g, stage) * ring_overlap(m, g, b, mc).exposed_s;
}

GroupTraffic cp_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage) {
  GroupTraffic t{"cp", "ring attention: K/V hops, dK/dV home"};
  if (g.cp <= 1) return t;
  const double blocks = blocks_on_stage(m, g, stage);
  const double K = kv_block_elements(m, g, b), d = dtype_bytes(g.dtype);
  const double kv_hops = (g.cp - 1) * (2.0 + (g.recompute || g.recompute_selective ? 1 : 0));
  t.ops = blocks * (kv_hops + g.cp);
  t.payload = t.wire = blocks * (kv_hops * K * d + g.cp * K * 4);
  const Link link = link_for_span(mc, int64_t(g.tp) * g.cp);
  t.seconds = blocks * (kv_hops * send_seconds(K * d, link) + g.cp * send_seconds(K * 4, link));
  t.inter_node = link.inter_node;
  return t;
}

}  // namespace loom::plan
