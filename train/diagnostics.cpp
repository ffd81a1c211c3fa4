#include "train/diagnostics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "train/evaluate.h"
#include "train/progress.h"
#include "train/device.h"
#include "nn/attention.h"
#include "nn/generate.h"
#include "nn/moe.h"
#include "nn/moe_bias_state.h"
#include "parallel/expert_parallel/routing_sync.h"
#include "optim/activation_memory.h"
#include "optim/memory_report.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/teach/symptoms.h"
#include "parallel/tensor_parallel/gpt.h"
#include "parallel/tensor_parallel/shard_map.h"
#include "parallel/trace/trace.h"
#include "tensor/ops.h"
#include "tensor/write_file.h"

namespace loom::train {

namespace {

// Whether progress may rewrite one line in place (\r). Under mpirun a rank's
// stdout is a pty that Open MPI forwards, so isatty() says yes even when
// mpirun's own output goes to a file: there, whole lines (LOOM_PROGRESS=tty
// asks for the one-line display anyway).
bool stdout_is_a_terminal() {
  const char* forced = std::getenv("LOOM_PROGRESS");
  if (forced && std::string(forced) == "tty") return true;
  if (forced && std::string(forced) == "lines") return false;
  return isatty(fileno(stdout)) && !std::getenv("OMPI_COMM_WORLD_SIZE");
}

}  // namespace

Diagnostics::Diagnostics(const Args& a, parallel::ProcessGroupManager& pgm, const Corpus& c, parallel::Model& m,
                         const parallel::DataParallelWrap& dp, optim::MixedPrecisionOptimizer& opt, int64_t start, int64_t end,
                         int64_t tokens_per_step)
    : a_(a), device_(rank_device(a)), pgm_(pgm), c_(c), m_(m), dp_(dp), opt_(opt), start_(start), end_(end),
      tokens_per_step_(tokens_per_step),
      rank0_(pgm.global_rank == 0), tty_(rank0_ && stdout_is_a_terminal()) {
  if (rank0_ && !a.log.empty()) {
    log_.open(a.log, start > 0 ? std::ios::app : std::ios::trunc);
    LOOM_CHECK(log_.good(), "--log: cannot open '", a.log, "' for writing");
  }
}

void Diagnostics::step_begins(int64_t step) {
  t0_ = std::chrono::steady_clock::now();
  launches_.restart();
  live_before_ = memory_stats(device_).live_bytes;
  if (a_.memory_report && step == start_) reset_peak_memory_stats(device_);
}

void Diagnostics::backward_done() { peak_ = memory_stats(device_).peak_bytes; }

void Diagnostics::step_done(int64_t step, double loss, double lr, const optim::StepResult& stepped,
                            const parallel::StageEvents& events) {
  launches_per_step_.push_back(launches_.count());  // the step's own launches: none of the reports' below
  // The schedule (text and picture) is of the second step when there is one: the first is slowed by
  // one-time work (oneDNN's kernel JIT, first allocations) that would fill its measured bubble.
  const int64_t svg_step = std::min(start_ + 1, end_ - 1);
  const bool text_now = a_.print_schedule && step == svg_step, svg_now = !a_.schedule_svg.empty() && step == svg_step;
  if ((text_now || svg_now) && pgm_.pp_size > 1) {
    std::string svg;
    std::string report = parallel::schedule_report(
        pgm_.pp_group(), events, a_.virtual_stages > 1 && a_.schedule == "1f1b" ? "interleaved 1f1b" : a_.schedule, &svg);
    if (rank0_ && text_now) std::printf("%s\n", report.c_str());
    if (rank0_ && svg_now) write_file_atomically(a_.schedule_svg, svg, "--schedule-svg");
  }
  if (a_.memory_report && step == start_) {
    if (!dp_.fsdp) opt_.finish_param_sync();  // ZeRO-3: the shards are measured, nothing gathered
    optim::MemoryBreakdown mine =
        dp_.fsdp ? optim::measure_memory_fully_sharded(*dp_.fsdp, opt_, peak_, live_before_)
                 : optim::measure_memory(m_.chunks->parameters(), dp_.bucket, dp_.zero, opt_, peak_, live_before_);
    optim::MemoryPrediction predicted =
        dp_.fsdp ? optim::predict_memory_fully_sharded(*dp_.fsdp, parse_dtype(a_.dtype), chunks_beside_held_unit(),
                                                       parallel::schedule_splits_backward(a_.schedule))
                 : optim::predict_memory_moe(m_.chunks->num_parameters() - expert_params(), expert_params(),
                                             parse_dtype(a_.dtype), sync_ranks(), expert_parallel_ranks(), a_.zero);
    if (dp_.bucket) {  // the buckets' padding; ZeRO-2's grads are the shards and the scratches (memory_report.h)
      const optim::BucketedParams b = bucketed_params();
      if (a_.zero == 2) predicted.grads = optim::predict_zero2_grad_bytes(b);
      predicted.comm = optim::predict_comm_bytes(b, parse_dtype(a_.dtype), a_.zero);
    }
    predicted.activations = int64_t(predicted_activation_bytes());
    std::string json;
    std::string table = optim::memory_report(mine, predicted, pgm_.world(), &json);
    if (rank0_) std::printf("%s%s", tty_ ? "\n" : "", table.c_str());
    if (rank0_ && parse_dtype(a_.dtype) == kBFloat16 && !device_.is_cuda())  // why the activations differ by CPU
      std::printf(" bf16 GEMMs: %s\n", optim::native_bf16_gemm(device_)
                                           ? "native (AVX512_BF16 or AMX), no fp32 copies of their operands"
                                           : "through fp32 (no AVX512_BF16 or AMX, or LOOM_GEMM_BF16=fp32), "
                                             "fp32 copies of their operands among the activations");
    if (rank0_ && a_.overlap_pairs)  // docs/18-zero-bubble.md: the peak under overlap is timing's
      std::printf(" --overlap-pairs: activ. peak's formula walks the pairs one half after the other; overlapped, a "
                  "pair's B may peak beside its F's work half done (below it) or its F's temporaries (above it)\n");
    if (rank0_ && dp_.fsdp)
      std::printf(" ZeRO-3: params, grads and optimizer state are this rank's shards; comm buffers: the gathered "
                  "units' full params at their peak (units held through the step + two adjacent units, optim/memory_report.h)\n");
    if (rank0_ && !a_.memory_json.empty()) write_file_atomically(a_.memory_json, json, "--memory-json");
    if (rank0_ && m_.tp) {
      // Where a tp rank's parameter count comes from: 1/tp of the split tensors, all of the replicated ones.
      const parallel::TensorParallelParamCount c = parallel::count_params(m_.tp->shard_maps(), pgm_.tp_size);
      std::printf("tensor parallel, rank 0's stage: params per rank = (split %lld + vocab padding %lld) / tp %d "
                  "+ replicated %lld = %lld (measured %lld)\n",
                  (long long)c.split, (long long)c.padding, c.tp, (long long)c.replicated, (long long)c.per_rank(),
                  (long long)m_.chunks->num_parameters());
    }
  }
  const std::string symptom = teach::symptom(step, stepped.grad_norm, m_, pgm_);  // --teach-break only
  if (!symptom.empty()) std::printf("%s%s", tty_ ? "\n" : "", symptom.c_str());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  total_ms_ += ms;
  const bool eval_now = a_.eval_every > 0 && ((step + 1) % a_.eval_every == 0 || step + 1 == a_.steps);
  double val = 0;
  if (eval_now) {
    opt_.finish_param_sync();
    val = evaluate(m_, c_.ds, {a_.batch, a_.eval_batches, a_.seed + 7919 * uint64_t(step + 1), c_.eod},
                   pgm_.cp_size > 1 ? &pgm_.cp_group() : nullptr);
  }
  StepReport rep{step, a_.steps, loss, lr, double(tokens_per_step_) / (ms / 1000.0), ms, stepped.grad_norm,
                 stepped.loss_scale, stepped.skipped, opt_.scaler() ? opt_.scaler()->scale() : 1.0, eval_now, val,
                 total_ms_ / double(step + 1 - start_) * double(end_ - step - 1) / 1000.0,
                 double(memory_stats(device_).live_bytes) / (1 << 20),
                 double(memory_stats(device_).peak_bytes) / (1 << 20)};
  // --experts: this step's routing, summed over the replicas' micro-batches and the pipeline's stages
  const nn::RoutingStats routed =
      parallel::take_routing_stats(*m_.chunks, pgm_.dp_group(), pgm_.pp_group(), c_.cfg.moe.experts);
  if (routed.forwards > 0) {
    rep.moe = true;
    rep.moe_balance = routed.aux_loss / double(routed.forwards);
    rep.moe_dropped = double(routed.dropped) / double(routed.slots);
    int64_t kept = 0, busiest = 0;
    for (int64_t l : routed.load) kept += l, busiest = std::max(busiest, l);
    rep.moe_max_load = kept > 0 ? double(busiest) * double(routed.load.size()) / double(kept) : 0.0;
  }
  if (log_.is_open()) {
    log_ << json_line(rep) << std::flush;
    LOOM_CHECK(log_.good(), "--log: cannot write '", a_.log, "' at step ", step + 1, ": ", std::strerror(errno));
  }
  if (tty_) print_progress(rep, /*tty=*/true);
  else if (rank0_ &&
           (step == start_ || (step + 1) % a_.log_every == 0 || eval_now || step + 1 == end_ || stepped.skipped))
    print_progress(rep, /*tty=*/false);
}

// This rank's routed experts' params (nn/moe.h: blocks.N.moe.experts.*), which their expert-dp group reduces.
int64_t Diagnostics::expert_params() const {
  int64_t n = 0;
  for (const auto& [name, p] : m_.chunks->named_parameters())
    if (name.find(".moe.experts.") != std::string::npos) n += p.numel();
  return n;
}

// The experts split over this many of the dp ranks (--ep).
int Diagnostics::expert_parallel_ranks() const { return pgm_.ep_size; }

// The ranks the gradients are reduced and ZeRO shards over: dp x cp (each cp rank holds a
// part of every sequence, so its gradient is partial too: process_group_manager.h's dp_cp_group).
int Diagnostics::sync_ranks() const { return pgm_.dp_cp_group().size(); }

std::vector<bool> Diagnostics::chunks_beside_held_unit() const {
  // Forwards in a row: AFAB, every stage; 1F1B, every stage but the model's last, in its warm-up.
  // Interleaved, the chunks that run between a forward of the rank's last chunk and its next backward.
  const int m = micro_batches_per_step(a_, pgm_.pp_size), v = int(m_.chunks->num_chunks());
  if (pgm_.pp_size == 1 || m < 2) return {};
  if (v > 1 && a_.schedule == "1f1b") return optim::zero3_chunks_beside_held(pgm_.pp_size, pgm_.pp_rank, v, m);
  const bool in_a_row = a_.schedule == "afab" || !m_.chunks->is_last_stage();
  return in_a_row ? std::vector<bool>(size_t(v), true) : std::vector<bool>{};
}

optim::BucketedParams Diagnostics::bucketed_params() const {
  optim::BucketedParams b{{}, {}, a_.bucket_mb, sync_ranks(), pgm_.expert_dp_group().size()};
  for (const Tensor& p : dp_.bucket->params()) (dp_.bucket->kept_apart(p) ? b.experts : b.dense).push_back(p.numel());
  return b;
}

double Diagnostics::predicted_activation_bytes() const {
  const nn::GPTConfig& cfg = c_.cfg;
  // --cp: a rank holds T / cp tokens of each sequence; ring attention in the core's place
  // (optim/ring_activations.h: it keeps its out and lse where the composed core keeps the scores).
  optim::ActivationCase c = optim::block_activation_case(
      cfg, a_.batch, cfg.block_size / pgm_.cp_size, pgm_.tp_size, a_.sequence_parallel,
      int64_t(element_size(parse_dtype(a_.dtype))), parallel::parse_recompute(a_.recompute));
  c.cp = pgm_.cp_size;
  c.vocab = pgm_.tp_size > 1 ? parallel::padded_vocab_size(cfg.vocab_size, pgm_.tp_size) : cfg.vocab_size;
  if (const std::vector<nn::MoE*> moe = nn::moe_layers(*m_.chunks); !moe.empty() && moe.back()->stats.forwards > 0) {
    // The routing's largest group in the last block, whose backward runs first (optim/moe_activations.h):
    // this rank's own (the latest micro-batch's) where its tokens are a part of the micro-batch's, whose
    // loads are summed over the ranks holding the others (sequence parallel: parallel/moe_token_shards.h).
    const nn::RoutingStats& st = moe.back()->stats;
    const bool split = a_.sequence_parallel && pgm_.tp_size > 1;
    const std::vector<int64_t>& load = split ? st.last_load : st.load;
    c.moe_largest_group = *std::max_element(load.begin(), load.end()) / (split ? 1 : st.forwards);
    micro_batch_routing(moe, c, st.loads.size() - 1);
  }
  c.native_bf16_gemm = parse_dtype(a_.dtype) == kBFloat16 && optim::native_bf16_gemm(device_);
  c.batch_tokens = tokens_per_step_;
  c.fused_attention = device_.is_cpu() && pgm_.cp_size == 1 && cfg.dropout == 0 && !nn::attention_reference_only() &&
                      (parse_dtype(a_.dtype) == kFloat32 || parse_dtype(a_.dtype) == kFloat64);
  for (const parallel::LayerRange& r : m_.chunks->chunks())  // items [embedding, blocks 1..L, head]
    for (int64_t i = r.start; i < r.end; ++i) c.blocks += (i >= 1 && i <= cfg.n_layer) ? 1 : 0;
  c.has_head = m_.chunks->is_last_stage();
  c.has_embedding = m_.chunks->is_first_stage();
  c.pp_stage = pgm_.pp_size > 1;
  c.micro_batches = micro_batches_per_step(a_, pgm_.pp_size);
  c.in_flight = optim::micro_batches_in_flight(a_.schedule.c_str(), c.micro_batches, pgm_.pp_size,
                                               pgm_.pp_rank, a_.virtual_stages);
  // ZeRO-3: the stage's gathered units, each unit's .grad tensors and reduce-scatter (zero3_activations.h);
  // with --pp the stage's own, in every micro-batch (measured = formula, or less the sent gradient:
  // tests/test_memory_ledger.cpp's pp2 zero3 modes, a stage of the head alone and without prefetch too), and
  // without reshard after forward every earlier layer's too, under --recompute full as well. Interleaved:
  // each chunk's own units, walked below (tests/test_memory_ledger.cpp's v2 zero3 modes; the experts' too,
  // test_memory_ledger_moe.cpp). ZB-H1: the stage's units through B, walked below (test_memory_ledger_zero_bubble.cpp).
  // Under a V it is refused (checks.cpp). With experts, B's experts are walked one by one with each
  // micro-batch's own rows (chunk_rows, optim/moe_activations.h; test_memory_ledger_moe.cpp's zero-bubble runs).
  if (dp_.fsdp && (pgm_.pp_size == 1 || m_.chunks->num_chunks() == 1))
    c.zero3 = optim::zero3_held(*dp_.fsdp, c.has_embedding, c.has_head);
  else if (!dp_.bucket) c.grad_bytes = 4 * m_.chunks->num_parameters();  // backward allocates fp32 .grad tensors
  if (m_.chunks->num_chunks() > 1 || a_.schedule == "zb-h1") {
    // Interleaved or split (ZB-H1's one chunk): each chunk's blocks, ends and
    // .grad bytes, walked through the rank's order; layers() holds the chunks' layers in order.
    std::vector<optim::ChunkActivations> chunks;
    std::vector<std::vector<Tensor>> params;  // each chunk's
    size_t layer = 0;
    for (const parallel::LayerRange& r : m_.chunks->chunks()) {
      optim::ChunkActivations k;
      params.emplace_back();
      const size_t first = layer;
      for (int64_t i = r.start; i < r.end; ++i, ++layer) {
        k.blocks += (i >= 1 && i <= cfg.n_layer) ? 1 : 0;
        for (const Tensor& t : m_.chunks->layers()[layer]->parameters()) params.back().push_back(t);
      }
      k.has_embedding = r.start == 0, k.has_head = r.end == cfg.num_layers();
      // ZeRO-3, interleaved 1F1B: each chunk's own units (its layers of the rank's); ZB-H1: the stage's. No
      // .grad outlives its unit.
      if (dp_.fsdp && ((m_.chunks->num_chunks() > 1 && a_.schedule == "1f1b") || a_.schedule == "zb-h1"))
        k.zero3 = optim::zero3_held(*dp_.fsdp, k.has_embedding, k.has_head, first, layer);
      chunks.push_back(k);
    }
    // One .grad per tensor: a V's stage 0 holds the tied wte in both chunks.
    // It is the last chunk's (the head's W runs before the embedding's).
    std::set<const TensorImpl*> counted;
    for (size_t k = chunks.size(); k-- > 0 && !dp_.bucket && !chunks[k].zero3.on;)
      for (const Tensor& t : params[k])
        if (counted.insert(t.impl()).second) chunks[k].grad_bytes += 4 * t.numel();
    const std::vector<std::vector<optim::RoutedRows>> routed = chunk_rows(c);  // a capacity or --ep
    return optim::predict_activations_interleaved(c, chunks, pgm_.pp_size, pgm_.pp_rank, a_.schedule,
                                                  routed.empty() ? nullptr : &routed)
        .total;
  }
  return costliest_micro_batch(c);
}

void Diagnostics::end_progress_line() {
  if (tty_) std::printf("\n");
}

void Diagnostics::finish() {
  opt_.finish_param_sync();
  if (!a_.trace.empty()) {
    parallel::trace::write(pgm_.world(), a_.trace);
    if (rank0_) std::printf("trace: %s (open in ui.perfetto.dev or chrome://tracing)\n", a_.trace.c_str());
    if (rank0_ && device_.is_cuda()) {
      std::printf("GPU launches per step (rank 0):");
      for (int64_t n : launches_per_step_) std::printf(" %lld", (long long)n);
      std::printf("\n");
    }
  }
  if (a_.sample <= 0) return;
  // The whole model on rank 0 (the stages gathered, tp shards joined), on this rank's device and dtype.
  const nn::NamedTensors full = parallel::gather_full_state(m_, pgm_);
  if (!rank0_) return;
  nn::GPT model(c_.cfg);
  model.to(parse_dtype(a_.dtype));
  model.load_state_dict(full);
  nn::load_router_biases(model, nn::router_biases(*m_.chunks), "the trained model");  // not params: copied apart
  model.to(device_);
  // The prompt: a newline, so the sample starts a line - or, in a corpus
  // without one, its first character in code-point order (token 0).
  std::vector<int32_t> prompt = c_.tok.prompt();
  std::vector<int32_t> out = nn::generate(model, prompt, {a_.sample, a_.temperature, a_.top_k, a_.seed});
  std::printf("---- sample (%lld %s, temperature %.2f) ----\n%s\n----\n", (long long)a_.sample, c_.tok.unit(),
              a_.temperature, c_.tok.decode(std::vector<int32_t>(out.begin() + 1, out.end())).c_str());
}

}  // namespace loom::train
