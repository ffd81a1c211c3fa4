#include "plan/moe_model.h"

#include <algorithm>

#include "nn/moe_token_dispatcher.h"
#include "plan/memory_model.h"

namespace loom::plan {

namespace {

int64_t expert_width(const ModelShape& m) { return m.expert_ffn > 0 ? m.expert_ffn : m.ffn_width(); }

}  // namespace

ModelShape mixtral_8x7b() {
  ModelShape m{32, 4096, 32, 32000, 4096, true, 8, 14336};
  m.experts = 8, m.experts_per_token = 2;
  return m;
}

ModelShape deepseek_v3() {
  ModelShape m{61, 7168, 128, 129280, 4096, true, 0, 18432};
  m.experts = 256, m.experts_per_token = 8, m.shared_experts = 1, m.expert_ffn = 2048, m.dense_layers = 3;
  const int64_t h = 7168, heads = 128;
  m.attn_params = h * 1536 + 1536 * heads * (128 + 64) + h * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h;
  return m;
}

bool is_moe_block(const ModelShape& m, int64_t block) { return m.experts > 0 && block >= m.dense_layers; }

int64_t mlp_params(const ModelShape& m, const Grid& g, int64_t block) {
  const int64_t h = m.width;
  if (!is_moe_block(m, block)) return (m.llama ? 3 : 2) * h * m.ffn_width() / g.tp;
  const int64_t one_expert = 3 * h * expert_width(m);  // w1, w3 [I, h], w2 [h, I]
  return m.experts * h + expert_params(m, g, block) + m.shared_experts * one_expert / g.tp;
}

int64_t expert_params(const ModelShape& m, const Grid& g, int64_t block) {
  if (!is_moe_block(m, block)) return 0;
  return m.experts / g.ep * 3 * m.width * expert_width(m);
}

double balanced_expert_rows(const ModelShape& m, int64_t tokens) {
  if (m.experts == 0) return 0;
  const double rows = double(tokens * m.experts_per_token) / double(m.experts);
  if (m.capacity_factor <= 0) return rows;
  return std::min(rows, double(nn::expert_capacity(m.capacity_factor, tokens, m.experts_per_token, m.experts)));
}

int64_t active_params(const ModelShape& m) {
  const int64_t h = m.width, one_expert = 3 * h * expert_width(m);
  int64_t n = 2 * m.vocab * h + h;  // wte, lm_head, the final norm (Llama's; MoE models are)
  for (int64_t i = 0; i < m.layers; ++i)
    n += m.attention_matmul_params() + 2 * h +
         (is_moe_block(m, i) ? m.experts * h + (m.experts_per_token + m.shared_experts) * one_expert
                             : 3 * h * m.ffn_width());
  return n;
}

double active_block_matmul_params(const ModelShape& m) {
  if (m.experts == 0) return double(m.block_matmul_params());
  const double moe = double(m.attention_matmul_params()) +
                     double(m.experts * m.width) +
                     double(m.experts_per_token + m.shared_experts) * 3.0 * double(m.width * expert_width(m));
  const double dense_blocks = double(std::min(m.dense_layers, m.layers));
  return (dense_blocks * double(m.block_matmul_params()) + (double(m.layers) - dense_blocks) * moe) / double(m.layers);
}

Grid expert_dp_grid(const Grid& g) {
  Grid e = g;
  e.dp = g.dp / g.ep;
  if (g.dp_shard) e.dp_shard = g.dp_shard / g.ep;
  return e;
}

double all_to_all_seconds(double bytes, int n, const Link& l) {
  if (n <= 1) return 0;
  return double(n - 1) * l.latency_s + double(n - 1) / n * bytes / l.bytes_per_s;
}

GroupTraffic ep_per_micro_batch(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, int stage) {
  GroupTraffic t{"ep", "all-to-all dispatch + combine of [b s k, h], forward and backward"};
  if (g.ep <= 1) return t;
  const Link link = link_for_span(mc, int64_t(g.tp) * g.cp * g.ep);
  const double tokens = double(b.micro_batch) * double(m.seq) / g.cp / (g.sequence_parallel ? g.tp : 1);
  const double one = tokens * double(m.experts_per_token) * double(m.width) * dtype_bytes(g.dtype);  // [N k, h]
  const double per_block = g.recompute ? 6 : 4;  // dispatch + combine, forward and backward (+ the rerun's forward)
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  for (int64_t i : items) {
    if (i < 1 || i > m.layers || !is_moe_block(m, i - 1)) continue;
    t.ops += per_block;
    t.payload += per_block * one;
    t.wire += per_block * one * double(g.ep - 1) / g.ep;
    t.seconds += per_block * all_to_all_seconds(one, g.ep, link);
  }
  t.inter_node = link.inter_node;
  return t;
}

}  // namespace loom::plan
