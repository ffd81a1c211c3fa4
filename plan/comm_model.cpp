#include "plan/comm_model.h"

#include <algorithm>

#include "plan/memory_model.h"

namespace loom::plan {

Link link_for_span(const Machine& mc, int64_t span) {
  const bool inter = !mc.one_node && span > mc.devices_per_node;
  const double gbs = inter ? mc.inter_gbs : mc.intra_gbs;
  return {gbs * 1e9 * mc.link_efficiency, (inter ? mc.inter_latency_us : mc.latency_us) * 1e-6, inter};
}

double all_reduce_seconds(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * l.latency_s + 2.0 * (n - 1) / n * bytes / l.bytes_per_s;
}

double all_gather_seconds(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return double(n - 1) * l.latency_s + double(n - 1) / n * bytes / l.bytes_per_s;
}

double send_seconds(double bytes, const Link& l) { return l.latency_s + bytes / l.bytes_per_s; }

GroupTraffic tp_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage) {
  GroupTraffic t{"tp", g.sequence_parallel ? "all-gather + reduce-scatter of [b,s,h]" : "all-reduce of [b,s,h]"};
  if (g.tp <= 1) return t;
  const Link link = link_for_span(mc, g.tp);
  const double bsh = double(b.micro_batch) * double(m.seq) / g.cp * double(m.width) * dtype_bytes(g.dtype);
  const double ring = 2.0 * (g.tp - 1) / g.tp;  // all-reduce, or all-gather + reduce-scatter
  auto add = [&](double count, double bytes) {
    t.ops += count * (g.sequence_parallel && bytes == bsh ? 2 : 1);
    t.payload += count * bytes;
    t.wire += count * bytes * ring;
    t.seconds += count * all_reduce_seconds(bytes, g.tp, link);
  };
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  for (int64_t i : items) {
    if (i == 0) add(1, bsh);  // vocab-parallel embedding: sum of the partial lookups
    else if (i == m.layers + 1) add(1, bsh), add(3, 4.0 * double(b.micro_batch) * double(m.seq) / g.cp);  // head, loss
    else add(g.recompute ? 6 : 4, bsh);
  }
  t.inter_node = link.inter_node;
  return t;
}

GroupTraffic pp_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage) {
  GroupTraffic t{"pp", "send activation forward, its gradient backward"};
  if (g.pp <= 1) return t;
  const Link link = link_for_span(mc, int64_t(g.world()));
  const double bytes = double(b.micro_batch) * double(m.seq) / g.cp * double(m.width) * dtype_bytes(g.dtype) /
                       (g.sequence_parallel ? g.tp : 1);
  // Each chunk sends forward unless it is the model's last, backward unless the first.
  const double sends = 2.0 * g.virtual_stages - (stage == g.pp - 1 ? 1 : 0) - (stage == 0 ? 1 : 0);
  t.ops = sends, t.payload = t.wire = sends * bytes, t.seconds = sends * send_seconds(bytes, link);
  t.inter_node = link.inter_node;
  return t;
}

GroupTraffic dp_per_step(int64_t params_on_rank, const Grid& g, const Machine& mc) {
  GroupTraffic t{"dp", g.zero == 3 ? "reduce-scatter fp32 grads + all-gather params twice (forward, backward)"
                       : g.zero   ? "reduce-scatter fp32 grads + all-gather params"
                                  : "all-reduce fp32 grads"};
  const int n = g.dp * g.cp;  // the gradients are averaged over dp x cp
  if (n <= 1) return t;
  const Link link = link_for_span(mc, int64_t(g.tp) * n);
  const double grads = 4.0 * double(params_on_rank), params = double(dtype_bytes(g.dtype)) * double(params_on_rank);
  const double ring = double(n - 1) / n;
  if (g.zero == 3 && g.replicas() > 1) {  // HSDP: the gathers inside a shard group, the grad shards across
    const int s = g.shard_ranks(), r = g.replicas();
    const Link inner = link_for_span(mc, int64_t(g.tp) * s);
    const double shard = grads / s, inner_ring = double(s - 1) / s;
    t.ops = (s > 1 ? 3 : 0) + 1, t.payload = (s > 1 ? grads + 2 * params : 0) + shard;
    t.wire = (s > 1 ? inner_ring * (grads + 2 * params) : 0) + 2 * double(r - 1) / r * shard;
    t.seconds = (s > 1 ? all_gather_seconds(grads, s, inner) + 2 * all_gather_seconds(params, s, inner) : 0) +
                all_reduce_seconds(shard, r, link);
    t.what = "reduce-scatter fp32 grads + all-gather params twice in the shard group, all-reduce the grad shard "
             "over replicas";
  } else if (g.zero) {  // ZeRO-3 gathers each unit again for its backward: one more all-gather of the params
    const double gathers = g.zero == 3 ? 2 : 1;
    t.ops = 1 + gathers, t.payload = grads + gathers * params, t.wire = ring * t.payload;
    t.seconds = all_gather_seconds(grads, n, link) + gathers * all_gather_seconds(params, n, link);
  } else {
    t.ops = 1, t.payload = grads, t.wire = 2 * ring * grads, t.seconds = all_reduce_seconds(grads, n, link);
  }
  t.inter_node = link.inter_node;
  return t;
}

GroupTraffic embedding_per_step(const ModelShape& m, const Grid& g, const Machine& mc) {
  GroupTraffic t{"embedding", "all-reduce the tied wte's fp32 grad (first + last stage)"};
  if (g.pp <= 1 || m.llama) return t;  // Llama's head is untied: nothing shared across stages
  // A V (zb-v, dualpipev) holds the embedding and the head on stage 0: one tensor, nothing to all-reduce.
  if (g.schedule == "zb-v" || g.schedule == "dualpipev") return t;
  const Link link = link_for_span(mc, int64_t(g.world()));
  const int64_t V = (m.vocab + g.tp - 1) / g.tp * g.tp;
  t.ops = 1, t.payload = 4.0 * double(V) * double(m.width) / g.tp, t.wire = t.payload;
  t.seconds = all_reduce_seconds(t.payload, 2, link);
  t.inter_node = link.inter_node;
  return t;
}

}  // namespace loom::plan
