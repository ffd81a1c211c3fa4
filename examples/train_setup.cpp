#include "examples/train_setup.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "examples/train_device.h"
#include "optim/checkpoint.h"
#include "optim/checkpoint_tensor_parallel.h"
#include "optim/distributed_optimizer.h"
#include "optim/param_groups.h"
#include "parallel/comm/build_info.h"
#include "parallel/comm/handshake.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "parallel/pipeline_parallel/gather_model.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/teach/teach_break.h"
#include "parallel/tensor_parallel/gpt.h"
#include "parallel/tensor_parallel/replicas.h"

namespace loom::train {

namespace {

template <typename... Args>
void say(bool rank0, const char* fmt, Args... args) {
  if (rank0) std::printf(fmt, args...);
}

}  // namespace

DType parse_dtype(const std::string& s) { return s == "bf16" ? kBFloat16 : s == "fp16" ? kFloat16 : kFloat32; }

void check_ranks_agree_on_flags(const std::string& flags) {
  // CLI11's dump of every option, one "name=value" per line: every rank must have been started with the same.
  parallel::RunFields fields;
  std::stringstream lines(flags);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string value = line.substr(eq + 1);
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
    fields.emplace_back(line.substr(0, eq), value);
  }
  parallel::check_ranks_agree(parallel::world(), fields, "flags");
  parallel::check_ranks_agree(parallel::world(), parallel::build_fields(), "build",  // parallel/comm/build_info.h
                              "every rank must run the same build of train_gpt, with the same LOOM_* kernels");
}

Corpus load_corpus(const Args& a, parallel::ProcessGroup& world) {
  const bool rank0 = world.rank() == 0;
  data::CorpusStats read;
  std::u32string text = data::read_corpus(a.data, &read);
  std::string vocab;
  nn::GPTConfig cfg{0, a.block, a.layers, a.heads, a.embd, a.dropout, a.seed};
  if (!a.resume.empty()) {
    cfg = optim::load_config(a.resume, &vocab);  // the checkpoint's architecture wins
    say(rank0, "resume: %s (the checkpoint's config: %lld layers, %lld heads, %lld embd, block %lld)\n",
        a.resume.c_str(), (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.n_embd,
        (long long)cfg.block_size);
  }
  data::CharTokenizer tok =
      vocab.empty() ? data::CharTokenizer::from_text(text) : data::CharTokenizer::from_vocab_utf8(vocab);
  cfg.vocab_size = tok.vocab_size();
  // The data handshake: every rank must read the same text (so the same vocabulary and batches).
  const std::string utf8 = data::encode_utf8(text);
  parallel::check_ranks_agree(world,
                              {{"corpus bytes", std::to_string(utf8.size())},
                               {"corpus hash (FNV-1a)", parallel::fingerprint(utf8.data(), utf8.size())},
                               {"vocabulary size", std::to_string(tok.vocab_size())}},
                              "data (--data " + a.data + ")");
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const Error& e) {  // only with --resume: the checkpoint's vocabulary lacks a character of this corpus
    throw Error(str("--data ", a.data, " does not fit the vocabulary of the checkpoint --resume ", a.resume, ": ",
                    e.what(), "; resume with the corpus the checkpoint was trained on"));
  }
  std::optional<data::TextDataset> ds;
  try {
    ds.emplace(std::move(ids), cfg.block_size);
  } catch (const Error& e) {  // a corpus too short for one block: name the file
    throw Error(str("--data ", a.data, ": ", e.what()));
  }
  say(rank0, "data: %s, %lld train / %lld val tokens%s, vocab %lld%s\n", a.data.c_str(),
      (long long)ds->train_tokens(), (long long)ds->val_tokens(), ds->val_note().c_str(), (long long)tok.vocab_size(),
      data::dropped_note(read).c_str());
  return Corpus{std::move(tok), std::move(*ds), cfg};
}

ModelOrStage build_model_or_stage(const nn::GPTConfig& cfg, const Args& a, parallel::ProcessGroupManager& pgm) {
  ModelOrStage m;
  if (pgm.pp_size() > 1 || pgm.tp_size() > 1) {
    // --virtual-stages v: v chunks per rank, for interleaved 1F1B.
    parallel::StagePartition parts =
        a.partition == "balanced"
            ? parallel::partition_balanced(parallel::gpt_layer_param_counts(cfg), pgm.pp_size(), a.virtual_stages)
            : parallel::partition_uniform(cfg.num_layers(), pgm.pp_size(), a.virtual_stages);
    // With --tp each layer of the stage is split over the tp group (a tp run
    // without --pp is one stage holding every layer).
    m.stage = std::make_shared<parallel::PipelineStage>(
        cfg, parts[size_t(pgm.pp_rank())], parallel::StageTensorParallel{&pgm.tp_group(), a.sequence_parallel});
    m.p2p = std::make_unique<parallel::PipelineP2P>(pgm.pp_group());
  } else {
    m.model = std::make_shared<nn::GPT>(cfg);
  }
  move_to_device(m, a);
  const bool rank0 = pgm.global_rank() == 0;
  const std::string where = pgm.pp_size() > 1 && pgm.tp_size() > 1 ? " on pipeline stage 0, tp rank 0"
                            : pgm.pp_size() > 1                    ? " on pipeline stage 0"
                            : pgm.tp_size() > 1                    ? " on tp rank 0"
                                                                   : "";
  say(rank0, "model: GPT %lld layers, %lld heads, %lld embd, block %lld: %lld parameters%s, %s\n",
      (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.n_embd, (long long)cfg.block_size,
      (long long)m.net().num_parameters(), where.c_str(), dtype_name(parse_dtype(a.dtype)));
  if (a.device != "cpu") {  // each rank's GPU, and how ranks exchange tensors
    if (rank0) std::printf("device: %s, TF32 %s, backend %s\n", a.device.c_str(), a.tf32 ? "on" : "off",
                           a.backend.empty() ? "nccl" : a.backend.c_str());
    if (pgm.world().size() > 1) {
      std::printf("rank %d: %s\n", pgm.global_rank(), rank_device(a).str().c_str());
      std::fflush(stdout);
    }
  }
  if (pgm.pp_size() > 1)
    say(rank0, "pipeline: %d stages, %s schedule, %s partition\n", pgm.pp_size(),
        a.virtual_stages > 1 ? str("interleaved 1f1b (", a.virtual_stages, " chunks per stage)").c_str()
                             : a.schedule.c_str(),
        a.partition.c_str());
  if (pgm.tp_size() > 1)
    say(rank0, "tensor parallel: %d ranks (heads, MLP and vocabulary split; vocab padded to %lld)%s\n",
        pgm.tp_size(), (long long)parallel::padded_vocab_size(cfg.vocab_size, pgm.tp_size()),
        a.sequence_parallel ? ", sequence parallel" : "");
  return m;
}

parallel::SharedWeightGradHandler tied_embedding_handler(ModelOrStage& m, parallel::ProcessGroupManager& pgm) {
  if (!m.pipelined()) return {};
  parallel::SharedWeightGradHandler shared = parallel::tied_embedding_handler(*m.stage, pgm);
  // Sequence parallelism: each tp rank's layernorms and row-parallel biases saw
  // T/tp of the tokens, so their gradients are summed over tp like the tied
  // embedding's over its group (Megatron's allreduce_layernorm_grads).
  for (const Tensor& p : m.stage->sequence_parallel_partial_params()) shared.add(p, pgm.tp_group());
  return shared;
}

void DataParallelWrap::zero_grad(nn::Module& net) {
  if (dp) dp->zero_grad();
  else autograd::zero_grad(net.parameters(), /*set_to_none=*/true);
}

DataParallelWrap wrap_data_parallel(ModelOrStage& m, const parallel::SharedWeightGradHandler& tied, const Args& a,
                                    parallel::ProcessGroupManager& pgm) {
  const bool fp32 = parse_dtype(a.dtype) == kFloat32;
  const bool use_buffer = pgm.dp_size() > 1 || !fp32 || a.zero;
  LOOM_CHECK(!use_buffer || a.dp_mode == "bucket" || (pgm.dp_size() > 1 && fp32 && !a.zero),
             "--dp-mode naive has no fp32 main_grad buffer; --dtype ", a.dtype, a.zero ? " --zero" : "",
             " needs --dp-mode bucket");
  DataParallelWrap w;
  if (use_buffer && a.dp_mode == "naive") {
    w.dp = std::make_unique<parallel::DataParallelNaive>(m.net().named_parameters(), pgm.dp_group());
  } else if (use_buffer) {
    parallel::BucketOptions bo{a.bucket_mb,
                               a.zero ? parallel::GradReduce::ReduceScatter : parallel::GradReduce::AllReduce,
                               /*grads_to_params=*/false};  // the optimizer reads main_grad
    auto bucketed = std::make_unique<parallel::DataParallelBucket>(m.net().named_parameters(), pgm.dp_group(), bo);
    // Under ZeRO the tied embedding's bucket is still all-reduced: the
    // shared-weight handler needs its whole gradient (shared_weights.h).
    if (a.zero)
      for (const Tensor& p : tied.params()) bucketed->bucket_manager().all_reduce_bucket_of(p);
    w.bucket = bucketed.get();
    w.dp = std::move(bucketed);
  }
  if (pgm.dp_size() > 1 && pgm.global_rank() == 0)
    std::printf("data parallel: %d ranks, %s %s%s\n", pgm.dp_size(), a.dp_mode.c_str(),
                a.zero ? "reduce-scatter" : "all-reduce",
                a.dp_mode == "bucket" ? (", buckets of " + str(a.bucket_mb) + " MiB").c_str() : "");
  return w;
}

std::unique_ptr<optim::MixedPrecisionOptimizer> make_optimizer(ModelOrStage& m, const DataParallelWrap& dp,
                                                                const Args& a, parallel::ProcessGroupManager& pgm) {
  optim::MixedPrecisionOptions mp;
  mp.max_grad_norm = a.grad_clip;
  mp.loss_scaling = parse_dtype(a.dtype) == kFloat16;
  mp.scaler = {a.loss_scale, a.loss_scale_growth, a.loss_scale_backoff, a.loss_scale_window};
  // The norm and found_inf are reduced over the ranks that together hold each
  // gradient once: the pipeline stages, and under ZeRO every dp shard too.
  mp.grad_stats_group = a.zero ? &pgm.world() : m.pipelined() ? &pgm.model_parallel_group() : nullptr;
  // --teach-break found-inf-wrong-group: only this stage's dp replicas, so stages decide alone.
  if (teach::broken(teach::Break::FoundInfWrongGroup)) mp.grad_stats_group = &pgm.dp_group();
  // The norm counts the tied weight once: the last stage's copy is left out.
  if (m.pipelined() && m.stage->is_last_stage() && !m.stage->is_first_stage())
    mp.not_counted.push_back(m.stage->embedding_weight());
  // And tensor parallelism's replicated params once: tp rank 0's copies (all tp ranks' are equal).
  if (m.pipelined() && pgm.tp_rank() != 0)
    for (const auto& [name, p] : m.stage->tp_replicated_params()) mp.not_counted.push_back(p);
  std::vector<optim::ParamGroup> groups = optim::gpt_param_groups(m.net(), a.lr, a.weight_decay);
  std::unique_ptr<optim::MixedPrecisionOptimizer> opt;
  if (a.zero) {
    auto zero = std::make_unique<optim::DistributedOptimizer>(groups, *dp.bucket, mp);
    // Each layer's forward pre-hook waits for its own buckets' all-gathers (param_gather_overlap.h).
    if (a.overlap_param_gather) zero->overlap_param_gather(m.pipelined() ? m.stage->layers() : m.model->layers());
    opt = std::move(zero);
  } else {
    optim::Optimizer::GradSource main_grad;
    if (parallel::DataParallelBucket* b = dp.bucket) main_grad = [b](const Tensor& p) { return b->main_grad(p); };
    opt = std::make_unique<optim::MixedPrecisionOptimizer>(groups, mp, main_grad);
  }
  if (pgm.global_rank() == 0)
    std::printf("optimizer: AdamW on fp32 main params%s%s%s\n", a.zero ? ", sharded over dp (ZeRO-1)" : "",
                a.overlap_param_gather ? ", param all-gathers overlapped with forward" : "",
                mp.loss_scaling ? ", dynamic loss scaling" : "");
  return opt;
}

void finish_param_sync(optim::MixedPrecisionOptimizer& opt) {
  if (auto* zero = dynamic_cast<optim::DistributedOptimizer*>(&opt)) zero->finish_param_sync();
}

int64_t resume(const Args& a, optim::MixedPrecisionOptimizer& opt, ModelOrStage& m, Generator& data_gen) {
  if (a.resume.empty()) return 0;
  // Every rank reads the manifest and the shards it needs.
  const bool tp = m.pipelined() && m.stage->tensor_parallel();
  optim::TrainState s =
      optim::load_checkpoint(a.resume, opt, m.net().named_parameters(), tp ? &m.stage->shard_maps() : nullptr);
  LOOM_CHECK(s.step <= a.steps, "--steps ", a.steps, " is below the step of the checkpoint --resume ", a.resume, " (",
             s.step, " steps done); to train further pass --steps > ", s.step);
  LOOM_CHECK(a.stop_at == 0 || s.step <= a.stop_at, "--stop-at ", a.stop_at, " is below the step of the checkpoint "
             "--resume ", a.resume, " (", s.step, " steps done): a save would label step ", s.step, "'s state as step ",
             a.stop_at, "; pass --stop-at >= ", s.step);
  data_gen.set_state(s.data_rng);
  nn::set_dropout_offset(m.net(), s.dropout_offset);  // the next masks are those the saved run would have drawn
  return s.step;
}

void save(const Args& a, int64_t steps_done, const Corpus& c, ModelOrStage& m, optim::MixedPrecisionOptimizer& opt,
          const Generator& data_gen, parallel::ProcessGroupManager& pgm) {
  if (a.save.empty()) return;
  finish_param_sync(opt);
  // The whole model's params on rank 0 (a pipeline's stages gathered).
  nn::NamedTensors full =
      m.pipelined() ? parallel::gather_stage_states(*m.stage, pgm.pp_group()) : m.net().state_dict();
  for (auto& entry : full) entry.second = ops::to(entry.second, kCPU);  // --device cuda: written from host copies
  const bool rank0 = pgm.global_rank() == 0;
  if (rank0) {
    std::filesystem::path dir = std::filesystem::path(a.save).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
  }
  pgm.world().barrier();  // the directory exists before any rank writes its shard
  // Replicas hold identical optimizer state: dp rank 0 writes it, or every rank its own ZeRO shard.
  // Under tp, each stage's state joined into full tensors, written by its tp rank 0 of dp rank 0.
  const nn::NamedTensors params = m.net().named_parameters();
  const optim::TrainState state{steps_done, data_gen.state(), nn::dropout_offset(m.net())};
  if (m.pipelined() && m.stage->tensor_parallel()) {
    // tp rank 0's copies are saved: first, that the other ranks' are the same bits.
    parallel::check_tp_replicas_identical(m.stage->tp_replicated_params(), pgm.tp_group());
    nn::NamedTensors joined = optim::full_optimizer_fragments(
        opt, params, {&m.stage->shard_maps(), &pgm.tp_group(), &pgm.dp_group(), a.zero});
    optim::save_checkpoint(a.save, full, c.cfg, c.tok.vocab_utf8(), opt, params, state,
                           pgm.world(), pgm.tp_rank() == 0 && pgm.dp_rank() == 0, &joined);
  } else {
    optim::save_checkpoint(a.save, full, c.cfg, c.tok.vocab_utf8(), opt, params, state,
                           pgm.world(), a.zero || pgm.dp_rank() == 0);
  }
  say(rank0, "%ssaved %s (step %lld)\n", isatty(fileno(stdout)) ? "\n" : "", a.save.c_str(), (long long)steps_done);
}

BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm) {
  const bool pipelined = pgm.pp_size() > 1;  // (a tp stage without --pp accumulates --grad-accum micro-batches)
  LOOM_CHECK(!pipelined || a.grad_accum == 1, "--grad-accum does not combine with --pp; use --microbatches");
  const int64_t K = pipelined ? (a.microbatches > 0 ? a.microbatches : pgm.pp_size()) : a.grad_accum;
  const BatchPlan plan{K, int64_t(pgm.dp_size()) * a.batch * K, int64_t(pgm.dp_rank()) * a.batch * K};
  say(pgm.global_rank() == 0,
      "batch: %lld sequences x %lld tokens per step (dp %d x micro-batch %lld x micro-batches %lld)\n",
      (long long)plan.global_batch, (long long)cfg.block_size, pgm.dp_size(), (long long)a.batch, (long long)K);
  return plan;
}

void check_ranks_agree_on_skip(int64_t step, const optim::StepResult& s, const optim::MixedPrecisionOptimizer& opt,
                               parallel::ProcessGroupManager& pgm) {
  if (!opt.scaler() || pgm.world().size() == 1) return;  // only fp16's loss scaler skips steps
  parallel::check_ranks_agree(pgm.world(), {{str("step ", step + 1, " skipped for overflow"), s.skipped ? "yes" : "no"}},
                              "decision whether to skip the step",
                              teach::broken(teach::Break::FoundInfWrongGroup)
                                  ? "--teach-break found-inf-wrong-group reduced found_inf over the dp group, so "
                                    "each pipeline stage decided alone"
                                  : "found_inf must be reduced over every rank holding part of the model, or the "
                                    "stages step different models");
}

void stop_if_diverged(int64_t step, double loss, const optim::StepResult& s) {
  // An fp16 step skipped for overflow is the loss scaler's business (it backs
  // off, and stops the run at its floor); anything else non-finite is divergence.
  if (s.skipped) return;
  LOOM_CHECK(std::isfinite(loss) && std::isfinite(s.grad_norm), "step ", step + 1,
             ": the training diverged (loss ", loss, ", grad norm ", s.grad_norm,
             "); stopping without saving, so the last checkpoint keeps finite weights (a too-high --lr?)");
}

void inject_overflow(const DataParallelWrap& dp, parallel::ProcessGroupManager& pgm) {
  if (pgm.global_rank() != 0) return;
  // The gradient sync carries the inf only as far as its bucket's reduction
  // does (an all-reduce: the dp group; a ZeRO reduce-scatter: the element's
  // owner alone; never to other pipeline stages); found_inf's all-reduce must
  // make every rank skip. The last param, not the first: that is the tied
  // embedding, whose gradient the shared-weight handler would also carry to
  // the last stage.
  LOOM_CHECK(dp.bucket, "--inject-overflow needs the main_grad buffer (--dtype fp16/bf16 or --zero)");
  const Tensor& p = dp.bucket->params().back();
  ops::fill_(optim::flat_range(dp.bucket->main_grad(p), 0, 1), std::numeric_limits<double>::infinity());
}

}  // namespace loom::train
