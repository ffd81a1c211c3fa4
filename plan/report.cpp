#include "plan/report.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "plan/moe_model.h"

namespace loom::plan {

namespace {

void say(std::string& out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  out += buf;
}

// "emb + 3 blocks + head": what a pipeline rank holds.
std::string stage_items(const ModelShape& m, const Grid& g, int stage) {
  int64_t blocks = 0;
  bool emb = false, head = false;
  const std::vector<int64_t> items = items_on_stages(m, g)[size_t(stage)];
  for (int64_t i : items) {
    if (i == 0) emb = true;
    else if (i == m.layers + 1) head = true;
    else ++blocks;
  }
  return std::string(emb ? "emb + " : "") + std::to_string(blocks) + " blk" + (head ? " + head" : "");
}

std::string bytes(double b) {
  char buf[32];
  // Binary units, as train_gpt's --memory-report and --trace (link rates stay GB/s, 1e9 bytes).
  constexpr double kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;
  if (b >= kGiB) std::snprintf(buf, sizeof buf, "%.2f GiB", b / kGiB);
  else if (b >= kMiB) std::snprintf(buf, sizeof buf, "%.2f MiB", b / kMiB);
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / kKiB);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  return buf;
}

void traffic_line(std::string& out, const GroupTraffic& t, double per_step, const Machine& mc) {
  if (t.ops == 0) return;
  say(out, "  %-9s %-10s %6.0f  %10s  %10s  %9s   %s\n", t.group.c_str(),
      mc.one_node ? "shm" : t.inter_node ? "InfiniBand" : "NVLink", t.ops * per_step,
      bytes(t.payload * per_step).c_str(), bytes(t.wire * per_step).c_str(), seconds(t.seconds * per_step).c_str(),
      t.what.c_str());
}

// Ring attention's overlap condition, one layer (plan/cp_model.h).
void ring_report(std::string& out, const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc,
                 const StagePlan& first) {
  const RingOverlap o = ring_overlap(m, g, b, mc);
  const Link link = link_for_span(mc, int64_t(g.tp) * g.cp);
  say(out, "\nring attention (cp %d over %s): one K/V block %s, chunks of c = s / 2cp = %.0f tokens; a hop hides "
      "behind its step's math from c* = d kv flops / (2 h bandwidth) = %.0f tokens\n",
      g.cp, mc.one_node ? "shm" : link.inter_node ? "InfiniBand" : "NVLink",
      bytes(kv_block_elements(m, g, b) * dtype_bytes(g.dtype)).c_str(), o.chunk_tokens, o.min_chunk_tokens);
  say(out, "  forward:  one K/V hop %s against one step's blocks %s\n", seconds(o.hop_fwd_s).c_str(),
      seconds(o.step_fwd_s).c_str());
  say(out, "  backward: one K/V + dK/dV hop %s against %s\n", seconds(o.hop_bwd_s).c_str(),
      seconds(o.step_bwd_s).c_str());
  say(out, "  %s: exposed per layer and micro-batch %s (the last dK/dV hop home%s), %s per micro-batch on pipeline "
      "rank 0\n", o.hidden() ? "the ring hides its hops" : "the ring does NOT hide its hops",
      seconds(o.exposed_s).c_str(), o.hidden() ? "" : " + what the steps leave", seconds(first.cp_exposed_s).c_str());
}

}  // namespace

int64_t total_params(const ModelShape& m) {
  const int64_t h = m.width;
  if (m.experts > 0) {  // a mixture of experts (plan/moe_model.h): every expert, tp 1, ep 1
    int64_t n = 2 * m.vocab * h + h;
    for (int64_t i = 0; i < m.layers; ++i) n += m.attention_matmul_params() + 2 * h + mlp_params(m, Grid{}, i);
    return n;
  }
  if (m.llama) return 2 * m.vocab * h + m.layers * (m.block_matmul_params() + 2 * h) + h;  // wte, lm_head untied
  return m.vocab * h + m.seq * h + m.layers * (12 * h * h + 13 * h) + 2 * h;
}

std::string report(const ModelShape& m, const Grid& g, const Batch& b, const Machine& mc, const StepPlan& s,
                   double train_tokens) {
  std::string out;
  say(out, "model: GPT %lld layers, width %lld, %lld heads, vocab %lld, seq %lld: %.4g parameters\n",
      (long long)m.layers, (long long)m.width, (long long)m.heads, (long long)m.vocab, (long long)m.seq,
      double(total_params(m)));
  if (m.llama)
    say(out, "architecture: llama: %lld kv heads, SwiGLU width %lld, untied head, no wpe, no biases\n",
        (long long)(m.kv_heads > 0 ? m.kv_heads : m.heads), (long long)m.ffn_width());
  if (m.experts > 0)
    say(out, "experts: %lld per MoE block (%lld blocks; the first %lld dense), %lld per token, %lld shared, width %lld;"
        " %.4g parameters active per token; ep %d: %lld experts per rank\n", (long long)m.experts,
        (long long)(m.layers - std::min(m.dense_layers, m.layers)), (long long)std::min(m.dense_layers, m.layers),
        (long long)m.experts_per_token, (long long)m.shared_experts,
        (long long)(m.expert_ffn > 0 ? m.expert_ffn : m.ffn_width()), double(active_params(m)), g.ep,
        (long long)(m.experts / g.ep));
  if (m.capacity_factor > 0)
    say(out, "capacity factor %g: each expert computes at most ceil(F N k / E) of a rank's N tokens' rows, a balanced "
        "router's N k / E when F >= 1 (plan/moe_model.h)\n", m.capacity_factor);
  const std::string zero = !g.zero             ? ""
                           : g.replicas() > 1 && g.zero == 3 ? ", ZeRO-3 hybrid sharded (shard groups of " +
                                                                  std::to_string(g.dp_shard) + " dp ranks)"
                                                            : ", ZeRO-" + std::to_string(g.zero);
  const std::string cp = g.cp > 1 ? " x cp " + std::to_string(g.cp) : "";
  say(out, "grid: dp %d x pp %d x tp %d%s = %d ranks, %d chunk(s) per stage, %s, %s, %s partition%s%s%s\n", g.dp, g.pp,
      g.tp, cp.c_str(), g.world(), g.virtual_stages, g.dtype.c_str(), g.schedule.c_str(), g.partition.c_str(), zero.c_str(),
      g.sequence_parallel ? ", sequence parallel" : "",
      g.recompute ? ", full recomputation" : g.recompute_selective ? ", selective recomputation" : "");
  say(out, "batch: micro-batch %lld x %lld micro-batches x dp %d = %lld sequences, %lld tokens per step\n",
      (long long)b.micro_batch, (long long)b.micro_batches, g.dp, (long long)(g.dp * b.micro_batch * b.micro_batches),
      (long long)b.tokens_per_step(m, g));
  if (g.ep > 1)
    say(out, "expert parallel: ep %d of the %d dp ranks; each expert on dp / ep = %d of them (its expert-dp group)\n",
        g.ep, g.dp, g.dp / g.ep);
  if (g.cp > 1)
    say(out, "context parallel: each rank holds %lld of every sequence's %lld tokens (zig-zag chunks of %lld)\n",
        (long long)(m.seq / g.cp), (long long)m.seq, (long long)(m.seq / (2 * g.cp)));
  say(out, "machine: %s\n  %.4g TFLOP/s %s peak x %.2f efficiency per rank%s, %.0f GiB, memory %.0f GB/s, links %.0f / %.0f GB/s"
      " (inside / across nodes, x %.2f), %d per node\n",
      mc.name.c_str(), mc.peak_tflops(g.dtype), g.dtype.c_str(), mc.efficiency,
      mc.one_node && g.world() > mc.devices_per_node ? " (more ranks than cores: they take turns)" : "", mc.memory_gib, mc.memory_bw_gbs,
      mc.intra_gbs, mc.inter_gbs, mc.link_efficiency, mc.devices_per_node);

  say(out, "\nmemory per rank (params/grads/optimizer: loom's bytes per param; activations: %s)\n",
      m.llama ? "loom's Llama formula, optim/activation_memory.h" : "Korthikanti et al. 2022");
  say(out, "  pp rank  holds                params       params      grads   optimizer  activations       total\n");
  for (int st = 0; st < g.pp; ++st) {
    const RankMemory& r = s.stages[size_t(st)].memory;
    say(out, "  %7d  %-18s %10lld  %11s %10s %11s  %11s  %10s%s\n", st, stage_items(m, g, st).c_str(),
        (long long)r.num_params, bytes(double(r.params)).c_str(), bytes(double(r.grads)).c_str(),
        bytes(double(r.optimizer)).c_str(), bytes(r.activations).c_str(), bytes(r.total()).c_str(),
        r.total() > mc.memory_gib * 1073741824.0 ? "  > capacity!" : "");
  }
  if (g.zero == 3) {
    std::string each;
    for (const auto& st : s.stages) each += (each.empty() ? "" : ", ") + bytes(double(st.memory.gathered));
    say(out, "  (total includes ZeRO-3's gathered units, %s%s: two neighbouring units, beside %s)\n", each.c_str(),
        g.pp > 1 ? " by pipeline rank" : "",
        g.pp > 1 ? "a stage's last unit while its forwards run in a row" : m.llama ? "nothing held" : "the embedding unit (the head's tied wte)");
  }
  say(out, "  (in flight at pipeline rank 0: %.3g micro-batches; one layer's activations %s per micro-batch)\n",
      micro_batches_in_flight(g, b.micro_batches, 0), bytes(activation_bytes_per_layer(m, g, b.micro_batch)).c_str());

  if (g.schedule == "zb-v" || g.schedule == "dualpipev")
    say(out, "\npipeline: %s's bubble with F = B = W on a chunk (p - 1)/(6 m + p - 1) = %d/%lld = %.1f%% of the "
        "pipeline's time (ZB-H1's: %.1f%%, 1F1B's: %.1f%%)\n", g.schedule == "zb-v" ? "ZB-V" : "DualPipeV", g.pp - 1,
        (long long)(6 * b.micro_batches + g.pp - 1), 100 * bubble_fraction(g, b.micro_batches),
        100.0 * (g.pp - 1) / double(3 * b.micro_batches + g.pp - 1),
        100.0 * (g.pp - 1) / double(b.micro_batches + g.pp - 1));
  else if (g.schedule == "zb-h1")
    say(out, "\npipeline: ZB-H1's bubble with F = B = W (p - 1)/(3 m + p - 1) = %d/%lld = %.1f%% of the pipeline's time "
        "(1F1B's: %.1f%%)\n", g.pp - 1, (long long)(3 * b.micro_batches + g.pp - 1),
        100 * bubble_fraction(g, b.micro_batches), 100.0 * (g.pp - 1) / double(b.micro_batches + g.pp - 1));
  else
    say(out, "\npipeline: bubble (p - 1)/(v m + p - 1) = %d/%lld = %.1f%% of the pipeline's time "
        "(Megatron's bubble/compute (p - 1)/(v m) = %d/%lld = %.1f%%)\n", g.pp - 1,
        (long long)(g.virtual_stages * b.micro_batches + g.pp - 1), 100 * bubble_fraction(g, b.micro_batches), g.pp - 1,
        (long long)(g.virtual_stages * b.micro_batches), 100 * bubble_over_compute(g, b.micro_batches));

  say(out, "\ncommunication per step per rank (tp and pp: pipeline rank 0; ring: all-reduce 2(n-1)/n, all-gather/reduce-scatter (n-1)/n on the wire)\n");
  say(out, "  group     link          ops     payload     on wire       time   what\n");
  const StagePlan& first = s.stages.front();
  traffic_line(out, first.tp, double(b.micro_batches), mc);
  traffic_line(out, first.pp, double(b.micro_batches), mc);
  traffic_line(out, first.cp, double(b.micro_batches), mc);
  traffic_line(out, first.ep, double(b.micro_batches), mc);
  traffic_line(out, s.dp, 1, mc);
  traffic_line(out, s.expert_dp, 1, mc);
  traffic_line(out, s.embedding, 1, mc);

  if (g.cp > 1) ring_report(out, m, g, b, mc, first);
  const double t = s.step_s;
  say(out, "\nstep time: %s = pipeline %s (bubble %s) + dp exposed %s + embedding %s + optimizer %s\n",
      seconds(t).c_str(), seconds(s.pipeline_s).c_str(), seconds(s.bubble_s).c_str(), seconds(s.dp_exposed_s).c_str(),
      seconds(s.embedding_s).c_str(), seconds(s.optimizer_s).c_str());
  say(out, "  shares: compute %.0f%%, tp %.0f%%, pp p2p %.0f%%, bubble %.0f%%, dp %.0f%%, embedding %.0f%%, optimizer %.0f%%%s\n",
      100 * s.compute_s / t, 100 * s.tp_s / t, 100 * s.pp_s / t, 100 * s.bubble_s / t, 100 * s.dp_exposed_s / t,
      100 * s.embedding_s / t, 100 * s.optimizer_s / t,
      s.cores_s > 0 ? (", taking turns on the cores " + std::to_string(int(100 * s.cores_s / t)) + "%").c_str() : "");
  if (g.cp > 1) say(out, "  of the pipeline: the ring's exposed hops %.1f%%\n", 100 * s.cp_s / t);
  if (g.ep > 1) say(out, "  of the pipeline: the experts' all-to-alls %.1f%%\n", 100 * s.ep_s / t);
  say(out, "  %.4g tokens/s; %.3g model TFLOP/s per rank: MFU %.1f%%, HFU %.1f%% (with recomputation's FLOPs)\n",
      s.tokens_per_s, s.model_flops / t / g.world() / 1e12, 100 * s.mfu, 100 * s.hfu);
  // Published MFUs (PaLM's appendix B aside) mostly count 6 N FLOPs a token, N the parameters: no attention
  // scores, the embedding lookup counted as a matmul. Compare with them on that count, not the one above.
  // A mixture of experts: N the parameters a token passes (active_params), as DeepSeek-V3 counts.
  const double n6 = double(m.experts > 0 ? active_params(m) : total_params(m));
  say(out, "  MFU on 6N FLOPs a token (N = %.4g %sparameters, attention left out, as most published MFUs count): %.1f%%\n",
      n6, m.experts > 0 ? "active " : "", 100 * 6 * n6 * s.tokens_per_s / g.world() / (mc.peak_tflops(g.dtype) * 1e12));
  say(out, "binds: %s\n", s.binds.c_str());
  if (train_tokens > 0) {
    const TrainTime tt = time_to_train(s, m, g, b, train_tokens);
    say(out, "to train %.4g tokens: %.0f steps x %s = %.4g hours (%.3g days) on %d ranks = %.4g %s-hours\n",
        train_tokens, tt.steps, seconds(t).c_str(), tt.seconds / 3600, tt.seconds / 86400, g.world(), tt.device_hours,
        mc.one_node ? "rank" : "GPU");
  }
  return out;
}

}  // namespace loom::plan
