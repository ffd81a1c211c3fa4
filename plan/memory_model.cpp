#include "plan/memory_model.h"

#include <algorithm>

#include "optim/activation_memory.h"
#include "optim/pipeline_activations.h"
#include "optim/memory_report.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/model_chunks.h"
#include "parallel/tensor_parallel/gpt.h"
#include "plan/moe_model.h"

namespace loom::plan {

int dtype_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

std::vector<std::vector<int64_t>> items_on_stages(const ModelShape& m, const Grid& g) {
  std::vector<std::vector<int64_t>> out(size_t(g.pp));
  const parallel::ChunkLayout layout = parallel::schedule_chunk_layout(g.schedule);
  if (g.partition == "blocks") {  // Megatron-LM: blocks 1..L evenly, then the embedding and the head added
    parallel::StagePartition parts = parallel::partition_uniform(m.layers, g.pp, g.virtual_stages, layout);
    for (int s = 0; s < g.pp; ++s)
      for (const parallel::LayerRange& r : parts[size_t(s)])
        for (int64_t i = r.start; i < r.end; ++i) out[size_t(s)].push_back(i + 1);
    out.front().insert(out.front().begin(), 0);
    (layout == parallel::ChunkLayout::V ? out.front() : out.back()).push_back(m.layers + 1);  // a V ends on stage 0
    return out;
  }
  nn::GPTConfig cfg;
  cfg.vocab_size = m.vocab, cfg.block_size = m.seq, cfg.n_layer = m.layers, cfg.n_head = m.heads, cfg.n_embd = m.width;
  if (m.llama) cfg.set_arch("llama"), cfg.n_kv_head = m.kv_heads, cfg.mlp_hidden = m.ffn_width();
  parallel::StagePartition parts =
      g.partition == "balanced"
          ? parallel::partition_balanced(parallel::gpt_layer_param_counts(cfg), g.pp, g.virtual_stages, layout)
          : parallel::partition_uniform(m.layers + 2, g.pp, g.virtual_stages, layout);
  for (int s = 0; s < g.pp; ++s)
    for (const parallel::LayerRange& r : parts[size_t(s)])
      for (int64_t i = r.start; i < r.end; ++i) out[size_t(s)].push_back(i);
  return out;
}

// Item i's params on one tp rank (the head's tied wte counted only when
// has_embedding is false: a stage holding both keeps one copy).
int64_t params_of_item(const ModelShape& m, const Grid& g, int64_t i, bool has_embedding) {
  const int64_t h = m.width, t = g.tp;
  const int64_t V = t > 1 ? parallel::padded_vocab_size(m.vocab, g.tp) : m.vocab;
  if (m.llama) {  // no wpe, no biases, RMSNorm weights only, an untied lm_head
    if (i == 0) return V * h / t;                                           // wte split
    if (i == m.layers + 1) return h + V * h / t;                            // ln_f, lm_head split
    if (m.experts > 0) return m.attention_matmul_params() / t + 2 * h + mlp_params(m, g, i - 1);  // plan/moe_model.h
    return m.block_matmul_params() / t + 2 * h;                             // one block
  }
  if (i == 0) return V * h / t + m.seq * h;                                 // wte split, wpe whole
  if (i == m.layers + 1) return 2 * h + (has_embedding ? 0 : V * h / t);    // ln_f, tied wte
  return (12 * h * h + 7 * h) / t + 6 * h;                                  // one block
}

int64_t params_on_stage(const ModelShape& m, const Grid& g, int stage) {
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  int64_t n = 0;
  for (int64_t i : items) n += params_of_item(m, g, i, items.front() == 0);
  return n;
}

double activation_bytes_per_layer(const ModelShape& m, const Grid& g, int64_t micro_batch) {
  if (m.llama) {  // loom's own count of a Llama block, the one --memory-report measures against
    nn::GPTConfig cfg{m.vocab, m.seq, m.layers, m.heads, m.width};
    cfg.set_arch("llama");
    cfg.n_kv_head = m.kv_heads, cfg.mlp_hidden = m.ffn;
    if (m.experts > 0) {  // a MoE block: optim/moe_activations.h's count (dropless), the expert width as the MLP's
      cfg.mlp_hidden = m.expert_ffn > 0 ? m.expert_ffn : m.ffn_width();
      cfg.moe.experts = m.experts, cfg.moe.experts_per_token = m.experts_per_token;
      cfg.moe.shared_experts = m.shared_experts;  // their SwiGLU, counted there too (SP's gathered inputs)
    }
    const parallel::Recompute recompute = g.recompute             ? parallel::Recompute::Full
                                          : g.recompute_selective ? parallel::Recompute::Selective
                                                                  : parallel::Recompute::None;
    optim::ActivationCase c = optim::block_activation_case(cfg, micro_batch, m.seq / g.cp, g.tp,
                                                           g.sequence_parallel, dtype_bytes(g.dtype), recompute);
    // A balanced router's rows: N k / E an expert from each rank, at most the capacity (plan/moe_model.h).
    const int64_t tokens = c.micro_batch * c.seq / (g.sequence_parallel ? g.tp : 1);  // SP: this tp rank's
    const double per_expert = balanced_expert_rows(m, tokens);
    if (m.capacity_factor > 0) c.moe_kept_rows = c.moe_last_rows = double(m.experts) * per_expert;
    if (m.experts > 0 && g.ep > 1) {  // --ep: a balanced router brings each rank the rows it sends
      c.moe_ep = g.ep, c.moe_received_rows = double(m.experts) * per_expert;
      c.moe_local_groups.assign(size_t(m.experts / g.ep), int64_t(per_expert * double(g.ep)));
    }
    return optim::predict_activations(c).per_block;
  }
  const double s = double(m.seq) / g.cp, b = double(micro_batch), h = double(m.width), a = double(m.heads),
               t = double(g.tp);
  const double scale = dtype_bytes(g.dtype) / 2.0;  // the formula counts 16-bit activations
  double per_sbh;
  const double core = g.recompute_selective ? 0 : 5 * a * s / (h * t);  // selective: rebuilt, not kept
  if (g.recompute) per_sbh = g.sequence_parallel ? 2 / t : 2;
  else if (g.sequence_parallel) per_sbh = 34 / t + core;
  else per_sbh = 10 + 24 / t + core;  // = 34 + 5as/h at t = 1
  return s * b * h * per_sbh * scale;
}

double micro_batches_in_flight(const Grid& g, int64_t micro_batches, int stage) {
  return optim::micro_batches_in_flight(g.schedule.c_str(), micro_batches, g.pp, stage, g.virtual_stages);
}

RankMemory memory_on_stage(const ModelShape& m, const Grid& g, const Batch& b, int stage) {
  RankMemory r;
  r.num_params = params_on_stage(m, g, stage);
  const DType dt = g.dtype == "fp32" ? kFloat32 : g.dtype == "bf16" ? kBFloat16 : kFloat16;
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  // ZeRO-3 shards over its shard group (HSDP: dp_shard x cp), ZeRO-1/2 over dp x cp; the experts'
  // state over their expert-dp group, dp x cp / ep (HSDP: its dp_shard x cp / ep in a shard group; plan/moe_model.h).
  int64_t experts = 0;
  for (int64_t i : items)
    if (i >= 1 && i <= m.layers) experts += expert_params(m, g, i - 1);
  const optim::MemoryPrediction p =
      optim::predict_memory(r.num_params - experts, dt, g.zero == 3 ? g.shard_ranks() : g.dp * g.cp, g.zero);
  const Grid edp = expert_dp_grid(g);
  const optim::MemoryPrediction e =
      optim::predict_memory(experts, dt, g.zero == 3 ? edp.shard_ranks() : edp.dp * g.cp, g.zero);
  r.params = p.params + e.params, r.grads = p.grads + e.grads, r.optimizer = p.optimizer + e.optimizer;
  r.expert_params = experts;

  if (g.zero == 3) {  // optim::zero3_gathered_elements over this stage's units (one a layer item)
    Grid one_stage = g;
    one_stage.pp = 1;
    optim::Zero3Units u;
    int chunk = 0;
    // The head's tied wte counts with it on a stage without the embedding (its own unit, gathered with the head).
    const bool has_embedding = items.front() == 0;
    for (size_t k = 0; k < items.size(); ++k) {
      u.numel.push_back(params_of_item(m, one_stage, items[k], has_embedding));
      chunk += k > 0 && items[k] != items[k - 1] + 1;  // interleaved: the next chunk's items
      u.chunk.push_back(chunk);
    }
    // GPT-2's head reads the embedding's tied wte where one stage holds both (one process, the V);
    // forwards in a row on all but the model's last stage (1F1B's warm-up), on every one under AFAB.
    u.first_held = !m.llama && has_embedding && items.back() == m.layers + 1;
    u.last_held = g.pp > 1 && b.micro_batches >= 2 && (g.schedule == "afab" || items.back() != m.layers + 1);
    // Interleaved 1F1B: the chunks that run while the last unit waits, walked through this rank's order.
    const bool interleaved = g.pp > 1 && g.virtual_stages > 1 && g.schedule == "1f1b";
    if (interleaved && b.micro_batches >= 2 && b.micro_batches % g.pp == 0) {
      u.beside_held = optim::zero3_chunks_beside_held(g.pp, stage, g.virtual_stages, int(b.micro_batches));
      u.last_held = std::find(u.beside_held.begin(), u.beside_held.end(), true) != u.beside_held.end();
    }
    r.gathered = optim::zero3_gathered_elements(u) * int64_t(dtype_bytes(g.dtype));
  }
  if (g.zero == 2) {  // + the two scratches (the header) of each buffer: under --ep the experts' own too
    const int64_t V = g.tp > 1 ? parallel::padded_vocab_size(m.vocab, g.tp) : m.vocab;
    const bool embedding = items.front() == 0 || items.back() == m.layers + 1;
    const double largest_param = double(embedding ? std::max(V, 4 * m.width) : 4 * m.width) * double(m.width) / g.tp;
    auto scratches = [](double n, double largest) {  // one bucket: one scratch
      const double bucket = std::min(n, std::max(25.0 * 1024 * 1024 / 4, largest));
      return n > 0 ? int64_t((bucket < n ? 2 : 1) * 4 * bucket) : 0;
    };
    const double apart = g.ep > 1 ? double(experts) : 0;  // in the experts' buffer, over expert-dp
    const double expert_width = double(m.expert_ffn > 0 ? m.expert_ffn : m.ffn_width());
    r.grads += scratches(double(r.num_params) - apart, largest_param) + scratches(apart, expert_width * double(m.width));
  }
  const int64_t blocks = int64_t(std::count_if(items.begin(), items.end(),
                                               [&](int64_t i) { return i >= 1 && i <= m.layers; }));
  // With recomputation one layer's full activations (selective: its core's)
  // also exist during its backward.
  const double one_layer = activation_bytes_per_layer(m, g, b.micro_batch);
  Grid full = g;
  full.recompute = full.recompute_selective = false;
  const double rebuilt = g.recompute ? activation_bytes_per_layer(m, full, b.micro_batch)
                         : g.recompute_selective ? activation_bytes_per_layer(m, full, b.micro_batch) - one_layer
                                                 : 0;
  const double in_flight = micro_batches_in_flight(g, b.micro_batches, stage);
  r.activations = double(blocks) * one_layer * in_flight + rebuilt;
  if (g.schedule == "zb-h1" && g.pp > 1 && !g.recompute && !m.llama) {
    // Split backward (optim/split_backward.h): at stage r's peak, its r-th B,
    // the first r micro-batches wait for their W holding only their linears'
    // X and dY, GPT-2: 4 + 12 / t units of [s, b, h] (the kept ones less the
    // softmax and, in this count's 16-bit bytes, the dropout masks).
    const double waiting = std::min(double(stage), in_flight - 1);
    const double held = double(m.seq) / g.cp * double(b.micro_batch) * double(m.width) * (4 + 12.0 / g.tp) *
                        dtype_bytes(g.dtype);
    r.activations -= double(blocks) * waiting * (one_layer - held);
  }
  if (items.back() == m.layers + 1)  // fp32 logits and their gradient, vocab split over tp
    r.activations += 2.0 * 4 * double(m.seq) / g.cp * double(b.micro_batch) * double(m.vocab) / g.tp;
  return r;
}

}  // namespace loom::plan
