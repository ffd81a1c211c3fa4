// train_gpt: the main job. A character-level GPT trained on a text corpus
// (Debian's fortunes by default), with a progress line, JSON-lines logs,
// checkpoints and a sample of generated text at the end.
//
// run() reads like picotron's train.py: process grid -> data -> model (cast to
// --dtype) -> data parallel -> optimizer (fp32 main params, sharded with
// --zero) -> loop. The wrapping order is the lesson.
//   build/examples/train_gpt --steps 200 --layers 4 --heads 4 --embd 128
//   mpirun -np 4 build/examples/train_gpt --dp 4        # same losses, 4 processes
//   mpirun -np 4 build/examples/train_gpt --dp 2 --pp 2 --microbatches 4
//   mpirun -np 4 build/examples/train_gpt --dp 4 --dtype bf16 --zero --memory-report
//
// Batches: --batch is the micro-batch one rank runs at a time; the global batch
// is dp x batch x grad-accum sequences, drawn identically on every rank, and
// each data-parallel rank takes its own contiguous slice of it. So
// `--dp 2 --batch 8`, `--batch 16` and `--batch 8 --grad-accum 2` see the same
// data and give the same losses (up to float rounding of the sums).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "autograd/engine.h"
#include "optim/checkpoint.h"
#include "data/data.h"
#include "examples/evaluate.h"
#include "examples/generate.h"
#include "optim/memory_report.h"
#include "optim/param_groups.h"
#include "examples/progress.h"
#include "examples/train_args.h"
#include "examples/train_step.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "optim/distributed_optimizer.h"
#include "optim/lr_schedule.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "parallel/comm/distributed.h"
#include "parallel/pipeline_parallel/gather_model.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "parallel/pipeline_parallel/shared_weights.h"
#include "parallel/process_group_manager.h"
#include "parallel/trace/trace.h"
#include "tensor/grad_mode.h"

using namespace loom;

namespace {

DType parse_dtype(const std::string& s) { return s == "bf16" ? kBFloat16 : s == "fp16" ? kFloat16 : kFloat32; }

int run(const train::Args& a) {
  // ---- processes: the grid of ranks (world = dp x pp) ------------------------------
  parallel::ProcessGroupManager pgm(a.dp, a.pp);
  const bool rank0 = pgm.global_rank() == 0;
  ops::set_num_threads(a.threads);
  if (!a.trace.empty()) parallel::trace::start(pgm.world());
  const bool tty = rank0 && isatty(fileno(stdout));
  auto say = [&](const char* fmt, auto... args) {
    if (rank0) std::printf(fmt, args...);
  };

  // ---- data (every rank reads it and draws the same global batches) -------------------
  std::u32string text = data::read_corpus(a.data);
  std::string vocab;
  nn::GPTConfig cfg{0, a.block, a.layers, a.heads, a.embd, a.dropout, a.seed};
  if (!a.resume.empty()) {
    cfg = train::load_config(a.resume, &vocab);  // the checkpoint's architecture wins
    say("resume: %s (the checkpoint's config: %lld layers, %lld heads, %lld embd, block %lld)\n", a.resume.c_str(),
        (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.n_embd, (long long)cfg.block_size);
  }
  data::CharTokenizer tok = vocab.empty() ? data::CharTokenizer::from_text(text)
                                          : data::CharTokenizer::from_vocab_utf8(vocab);
  cfg.vocab_size = tok.vocab_size();
  data::TextDataset ds(tok.encode(text), cfg.block_size);
  say("data: %s, %lld train / %lld val tokens, vocab %lld\n", a.data.c_str(), (long long)ds.train_tokens(),
      (long long)ds.val_tokens(), (long long)tok.vocab_size());

  // ---- model -> data parallel -> optimizer ---------------------------------------------
  // One process holds the whole GPT; a pipeline stage builds only its layers
  // [embedding, block_0 .. block_{L-1}, head] slice (parallel/partition.h).
  const bool pipelined = pgm.pp_size() > 1;
  std::shared_ptr<nn::GPT> model;
  std::shared_ptr<parallel::PipelineStage> stage;
  if (pipelined) {
    parallel::StagePartition parts =
        a.partition == "balanced"
            ? parallel::partition_balanced(parallel::gpt_layer_param_counts(cfg), pgm.pp_size())
            : parallel::partition_uniform(cfg.num_layers(), pgm.pp_size());
    stage = std::make_shared<parallel::PipelineStage>(cfg, parts[size_t(pgm.pp_rank())][0]);
  } else {
    model = std::make_shared<nn::GPT>(cfg);
  }
  nn::Module& net = pipelined ? static_cast<nn::Module&>(*stage) : *model;
  // Mixed precision: the model's params (and so its activations) in bf16/fp16;
  // the optimizer keeps fp32 main params (optim/mixed_precision_optimizer.h).
  const DType dtype = parse_dtype(a.dtype);
  if (dtype != kFloat32) net.to(dtype);
  const int64_t n_params = net.num_parameters();
  say("model: GPT %lld layers, %lld heads, %lld embd, block %lld: %lld parameters%s, %s\n", (long long)cfg.n_layer,
      (long long)cfg.n_head, (long long)cfg.n_embd, (long long)cfg.block_size, (long long)n_params,
      pipelined ? " on pipeline stage 0" : "", dtype_name(dtype));
  // The tied embedding across the first and last stage (Megatron's embedding group).
  parallel::SharedWeightGradHandler shared;
  std::unique_ptr<parallel::PipelineP2P> p2p;
  if (pipelined) {
    shared = parallel::tied_embedding_handler(*stage, pgm);
    p2p = std::make_unique<parallel::PipelineP2P>(pgm.pp_group());
    say("pipeline: %d stages, %s schedule, %s partition\n", pgm.pp_size(), a.schedule.c_str(), a.partition.c_str());
  }

  // Gradients accumulate in DataParallelBucket's fp32 main_grad buffer whenever
  // there is more than one replica, the model is not fp32 (bf16 sums lose
  // bits), or the optimizer is sharded (ZeRO-1 shards that buffer) - on a
  // single process too, as a dp group of one (Megatron always wraps in DDP).
  const bool use_buffer = pgm.dp_size() > 1 || dtype != kFloat32 || a.zero;
  LOOM_CHECK(!use_buffer || a.dp_mode == "bucket" || (pgm.dp_size() > 1 && dtype == kFloat32 && !a.zero),
             "--dp-mode naive has no fp32 main_grad buffer; --dtype ", a.dtype, a.zero ? " --zero" : "",
             " needs --dp-mode bucket");
  std::unique_ptr<parallel::DataParallel> dp;
  parallel::DataParallelBucket* bucket_dp = nullptr;
  if (use_buffer && a.dp_mode == "naive") {
    dp = std::make_unique<parallel::DataParallelNaive>(net.named_parameters(), pgm.dp_group());
  } else if (use_buffer) {
    parallel::BucketOptions bo{a.bucket_mb,
                               a.zero ? parallel::GradReduce::ReduceScatter : parallel::GradReduce::AllReduce,
                               /*grads_to_params=*/false};  // the optimizer reads main_grad
    auto bucketed = std::make_unique<parallel::DataParallelBucket>(net.named_parameters(), pgm.dp_group(), bo);
    // Under ZeRO the tied embedding's bucket is still all-reduced: the
    // shared-weight handler needs its whole gradient (shared_weights.h).
    if (a.zero && !shared.empty()) bucketed->bucket_manager().all_reduce_bucket_of(stage->embedding_weight());
    bucket_dp = bucketed.get();
    dp = std::move(bucketed);
  }
  if (pgm.dp_size() > 1)
    say("data parallel: %d ranks, %s %s%s\n", pgm.dp_size(), a.dp_mode.c_str(),
        a.zero ? "reduce-scatter" : "all-reduce",
        a.dp_mode == "bucket" ? (", buckets of " + std::to_string(a.bucket_mb) + " MB").c_str() : "");

  optim::MixedPrecisionOptions mp;
  mp.max_grad_norm = a.grad_clip;
  mp.loss_scaling = dtype == kFloat16;
  mp.scaler = {a.loss_scale, a.loss_scale_growth, a.loss_scale_backoff, a.loss_scale_window};
  // The norm and found_inf are reduced over the ranks that together hold each
  // gradient once: the pipeline stages, and under ZeRO every dp shard too.
  mp.grad_stats_group = a.zero ? &pgm.world() : pipelined ? &pgm.model_parallel_group() : nullptr;
  // The norm counts the tied weight once: the last stage's copy is left out.
  if (pipelined && stage->is_last_stage() && !stage->is_first_stage())
    mp.not_counted.push_back(stage->embedding_weight());
  std::vector<optim::ParamGroup> groups = train::gpt_param_groups(net, a.lr, a.weight_decay);
  std::unique_ptr<optim::MixedPrecisionOptimizer> opt;
  optim::DistributedOptimizer* zero_opt = nullptr;
  if (a.zero) {
    auto d = std::make_unique<optim::DistributedOptimizer>(groups, *bucket_dp, mp);
    zero_opt = d.get();
    opt = std::move(d);
  } else {
    optim::Optimizer::GradSource main_grad;
    if (bucket_dp) main_grad = [bucket_dp](const Tensor& p) { return bucket_dp->main_grad(p); };
    opt = std::make_unique<optim::MixedPrecisionOptimizer>(groups, mp, main_grad);
  }
  say("optimizer: AdamW on fp32 main params%s%s\n", a.zero ? ", sharded over dp (ZeRO-1)" : "",
      mp.loss_scaling ? ", dynamic loss scaling" : "");
  // The params are views into the all-gathered param buffer under ZeRO: wait
  // for the all-gathers before anything reads them.
  auto finish_param_sync = [&] {
    if (zero_opt) zero_opt->finish_param_sync();
  };

  Generator data_gen(a.seed);
  int64_t start = 0;
  const nn::NamedTensors named = net.named_parameters();
  if (!a.resume.empty()) {  // every rank reads the index and the shards it needs
    train::TrainState s = train::load_checkpoint(a.resume, *opt, named);
    data_gen.set_state(s.data_rng);
    start = s.step;
  }

  std::ofstream log;
  if (rank0 && !a.log.empty()) {
    log.open(a.log, start > 0 ? std::ios::app : std::ios::trunc);
    LOOM_CHECK(log.good(), "--log: cannot open '", a.log, "' for writing");
  }
  auto save = [&](int64_t step_done) {
    if (a.save.empty()) return;
    finish_param_sync();
    // The whole model's params on rank 0 (a pipeline's stages gathered).
    nn::NamedTensors full = pipelined ? parallel::gather_stage_states(*stage, pgm.pp_group()) : net.state_dict();
    if (rank0) {
      std::filesystem::path dir = std::filesystem::path(a.save).parent_path();
      if (!dir.empty()) std::filesystem::create_directories(dir);
    }
    pgm.world().barrier();  // the directory exists before any rank writes its shard
    // Replicas hold identical optimizer state: dp rank 0 writes it, or every rank its own ZeRO shard.
    train::save_checkpoint(a.save, full, cfg, tok.vocab_utf8(), *opt, named, {step_done, data_gen.state()},
                           pgm.world(), a.zero || pgm.dp_rank() == 0);
    say("%ssaved %s (step %lld)\n", tty ? "\n" : "", a.save.c_str(), (long long)step_done);
  };

  // ---- the training loop ------------------------------------------------------
  const double min_lr = a.lr * a.min_lr_ratio;
  // Micro-batches per step: --grad-accum on one stage, --microbatches in a pipeline.
  LOOM_CHECK(!pipelined || a.grad_accum == 1, "--grad-accum does not combine with --pp; use --microbatches");
  const int64_t K = pipelined ? (a.microbatches > 0 ? a.microbatches : pgm.pp_size()) : a.grad_accum;
  const int64_t global_batch = int64_t(pgm.dp_size()) * a.batch * K;
  const int64_t tokens_per_step = global_batch * cfg.block_size;
  say("batch: %lld sequences x %lld tokens per step (dp %d x micro-batch %lld x micro-batches %lld)\n",
      (long long)global_batch, (long long)cfg.block_size, pgm.dp_size(), (long long)a.batch, (long long)K);
  double total_ms = 0;
  const int64_t end = a.stop_at > 0 ? std::min(a.stop_at, a.steps) : a.steps;
  for (int64_t step = start; step < end; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    double lr = optim::lr_at(step, a.lr, std::min(a.warmup, a.steps), a.steps, min_lr);
    opt->set_lr(lr);
    finish_param_sync();  // last step's updated params are in place before this forward
    const int64_t live_before = memory_stats().live_bytes;
    if (a.memory_report && step == start) reset_peak_memory_stats();
    if (step == a.inject_overflow && pgm.global_rank() == 0) {
      // A test aid: an inf in one element of rank 0's gradient buffer, before
      // backward adds into it. The gradient sync carries it only as far as its
      // bucket's reduction does (an all-reduce: the dp group; a ZeRO
      // reduce-scatter: the element's owner alone; never to other pipeline
      // stages); found_inf's all-reduce must make every rank skip. The last
      // param, not the first: that is the tied embedding, whose gradient the
      // shared-weight handler would also carry to the last stage.
      LOOM_CHECK(bucket_dp, "--inject-overflow needs the main_grad buffer (--dtype fp16/bf16 or --zero)");
      const Tensor& p = bucket_dp->params().back();
      ops::fill_(optim::flat_range(bucket_dp->main_grad(p), 0, 1), std::numeric_limits<double>::infinity());
    }

    // This rank's rows of the global batch, as K micro-batches; only the last
    // backward syncs gradients (examples/train_step.h). Under fp16 each loss is
    // also multiplied by the loss scale before backward.
    data::Batch global = ds.sample("train", global_batch, data_gen);
    std::vector<data::Batch> mbs = train::micro_batches(global, int64_t(pgm.dp_rank()) * a.batch * K, a.batch, K);
    double local_loss = 0;
    if (pipelined) {
      parallel::PipelineStepResult r = train::pipeline_gradients(*stage, *p2p, mbs, a.schedule, *opt, dp.get());
      local_loss = r.loss;
      // After backward and the data-parallel sync: sum the tied embedding's gradients.
      shared.all_reduce_grads(bucket_dp);
      if (a.print_schedule && step == start) {
        std::string report = parallel::schedule_report(pgm.pp_group(), r.events, a.schedule);
        if (rank0) std::printf("%s\n", report.c_str());
      }
    } else {
      local_loss = train::accumulate_gradients(*model, mbs, *opt, dp.get());
    }
    // The logged loss is the global-batch mean.
    Tensor loss_t = full({}, local_loss, kFloat64);
    if (pgm.dp_size() > 1) pgm.dp_group().all_reduce(loss_t, parallel::ReduceOp::Avg);
    const double loss_v = loss_t.item<double>();
    const int64_t peak = memory_stats().peak_bytes;

    optim::StepResult stepped;
    {
      parallel::trace::Span span("optimizer step");
      stepped = opt->step();  // unscale, found_inf, clip, AdamW, main -> model params
    }
    if (a.memory_report && step == start) {
      finish_param_sync();
      train::MemoryBreakdown m = train::measure_memory(net.parameters(), bucket_dp, *opt, peak, live_before);
      std::string table = train::memory_report(m, train::predict_memory(n_params, dtype, pgm.dp_size(), a.zero),
                                               pgm.world());
      if (rank0) std::printf("%s%s", tty ? "\n" : "", table.c_str());
    }
    if (dp) dp->zero_grad();
    else autograd::zero_grad(net.parameters(), /*set_to_none=*/true);

    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    total_ms += ms;
    double tok_s = double(tokens_per_step) / (ms / 1000.0);
    bool eval_now = a.eval_every > 0 && ((step + 1) % a.eval_every == 0 || step + 1 == a.steps);
    double val = 0;
    if (eval_now) {
      finish_param_sync();
      const train::EvalBatches eb{a.batch, a.eval_batches, a.seed + 7919 * uint64_t(step + 1)};
      val = pipelined ? train::evaluate_pipeline(*stage, *p2p, ds, eb) : rank0 ? train::evaluate(*model, ds, eb) : 0;
    }
    train::StepReport rep{step, a.steps, loss_v, lr, tok_s, ms, stepped.grad_norm, stepped.loss_scale, stepped.skipped,
                          opt->scaler() ? opt->scaler()->scale() : 1.0, eval_now, val,
                          total_ms / double(step + 1 - start) * double(end - step - 1) / 1000.0};
    if (log.is_open()) log << train::json_line(rep) << std::flush;
    if (tty) train::print_progress(rep, /*tty=*/true);
    else if (rank0 &&
             (step == start || (step + 1) % a.log_every == 0 || eval_now || step + 1 == end || stepped.skipped))
      train::print_progress(rep, /*tty=*/false);
    if (a.save_every > 0 && (step + 1) % a.save_every == 0 && step + 1 < end) save(step + 1);
  }
  if (tty) std::printf("\n");
  finish_param_sync();
  save(end);
  if (!a.trace.empty()) {
    parallel::trace::write(pgm.world(), a.trace);
    say("trace: %s (open in ui.perfetto.dev or chrome://tracing)\n", a.trace.c_str());
  }

  // ---- a sample of generated text -------------------------------------------------
  // A pipeline's stages are gathered into one GPT on rank 0 first.
  if (a.sample > 0 && pipelined) {
    nn::NamedTensors full = parallel::gather_stage_states(*stage, pgm.pp_group());
    if (rank0) {
      model = std::make_shared<nn::GPT>(cfg);
      if (dtype != kFloat32) model->to(dtype);
      model->load_state_dict(full);
    }
  }
  if (rank0 && a.sample > 0) {
    std::vector<int32_t> prompt = tok.encode(U"\n");
    std::vector<int32_t> out = train::generate(*model, prompt, {a.sample, a.temperature, a.top_k, a.seed});
    std::printf("---- sample (%lld characters, temperature %.2f) ----\n%s\n----\n", (long long)a.sample,
                a.temperature, tok.decode(std::vector<int32_t>(out.begin() + 1, out.end())).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  train::Args a;
  CLI::App app{"train_gpt: train a character-level GPT with loom"};
  train::add_options(app, a);
  CLI11_PARSE(app, argc, argv);
  // parallel::run: on a plain launch a world of one; under mpirun an exception on
  // any rank prints "[loom rank R] error: ..." and ends the whole job with exit 1.
  return parallel::run(argc, argv, [&] { return run(a); });
}
