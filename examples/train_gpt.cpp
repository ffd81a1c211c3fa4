// train_gpt: the main job. A character-level GPT trained on a text corpus
// (Debian's fortunes by default), with a progress line, JSON-lines logs,
// checkpoints and a sample of generated text at the end.
//
// run() reads like picotron's train.py: process grid (then the corpus) ->
// model (this rank's layer chunks: its pipeline stage's layers, each its tp
// shard) -> dtype -> finalize step -> data parallel -> optimizer (fp32 main
// params, sharded with --zero) -> resume -> loop.
// The wrapping order is the lesson; each wrapper is one helper in
// train_setup.h that says what it builds and why, and the step's pieces are
// train_step.h's. The loop's training section ends where llm.c's does: what
// follows it (train/diagnostics.h) reports, evaluates and saves, and changes no
// number of the run. The program's machinery - flags and their checks, the
// corpus, checkpoints, the device, the guards - is the library train/.
//   build/examples/train_gpt --steps 200 --layers 4 --heads 4 --embd 128
//   mpirun -np 4 build/examples/train_gpt --dp 4        # same losses, 4 processes
//   mpirun -np 4 build/examples/train_gpt --dp 2 --pp 2 --microbatches 4
//   mpirun -np 4 build/examples/train_gpt --dp 4 --dtype bf16 --zero --memory-report
//   mpirun -np 4 build/examples/train_gpt --dp 4 --dtype bf16 --zero 3 --memory-report  # FSDP: the params sharded too
//   mpirun -np 4 build/examples/train_gpt --tp 2 --pp 2 --sequence-parallel   # each matmul split over 2 ranks
//   mpirun -np 2 build/examples/train_gpt --cp 2      # each sequence split over 2 ranks, attention as a ring
//   build/examples/train_gpt --device cuda           # one GPU, the same losses as the CPU run (TF32 off)
//
// Batches: --batch is the micro-batch one rank runs at a time; the global batch
// is dp x batch x grad-accum sequences, drawn identically on every rank, and
// each data-parallel rank takes its own contiguous slice of it. So
// `--dp 2 --batch 8`, `--batch 16` and `--batch 8 --grad-accum 2` see the same
// data and give the same losses (up to float rounding of the sums).
#include <CLI/CLI.hpp>

#include "examples/train_setup.h"
#include "examples/train_step.h"
#include "nn/moe_aux_loss.h"
#include "optim/lr_schedule.h"
#include "parallel/comm/distributed.h"
#include "parallel/expert_parallel/routing_sync.h"
#include "parallel/forward_backward.h"
#include "parallel/teach/teach_break.h"
#include "parallel/trace/trace.h"
#include "train/args.h"
#include "train/checkpoint.h"
#include "train/corpus.h"
#include "train/device.h"
#include "train/diagnostics.h"
#include "train/guards.h"

using namespace loom;

namespace {

int run(const train::Args& a, const std::string& flags) {
  train::validate(a);                     // every flag's range and every output path, before any work
  train::check_ranks_agree_on_flags(flags);  // every rank started alike, before the first collective
  teach::set_break(teach::parse_break(a.teach_break));  // --teach-break: a classic bug on purpose (default: none)
  // ---- the wrapping order -----------------------------------------------------------------
  // The grid of ranks: world = dp x cp x pp x tp. Its groups are MPI's, or with
  // --device cuda over NCCL each group's NCCL twin carries the GPU tensors.
  const std::unique_ptr<parallel::ProcessGroup> gpu_world = train::gpu_world(a);
  parallel::ProcessGroupManager pgm(a.dp, a.pp, a.tp, a.cp, gpu_world ? *gpu_world : parallel::world(), a.dp_shard,
                                    a.ep);
  ops::set_num_threads(a.threads);
  if (!a.trace.empty()) {
    parallel::trace::start(pgm.world());
    const Device d = train::rank_device(a);
    if (d.is_cuda()) parallel::trace::set_gpu(d);  // + the GPU's own tracks: when its kernels and NCCL ran
  }
  train::Corpus corpus = train::load_corpus(a, pgm.world());  // same text and batches on every rank
  parallel::Model m = train::build_model(corpus.cfg, a, pgm);  // this rank's layer chunks: its stage, its tp shards
  train::init_from_hf(a, m, pgm);  // --init-from: a Hugging Face folder's weights
  train::expert_parallel(m, a, pgm);  // --ep: E / ep experts per rank, tokens to them by all-to-all
  const DType dtype = train::parse_dtype(a.dtype);
  if (dtype != kFloat32) m.chunks->to(dtype);  // bf16/fp16 params and activations; fp32 main params below
  parallel::FinalizeModelGrads finalize(m, pgm);  // after backward: tied embedding, SP grads
  parallel::DataParallelWrap dp = train::wrap_data_parallel(m, finalize, a, pgm);  // + the fp32 main_grad buffer
  auto opt = train::make_optimizer(m, dp, finalize, a, pgm);  // AdamW on fp32 main params; ZeRO-1
  Generator data_gen(a.seed);                                   // draws the global batches
  const int64_t start = train::resume(a, *opt, m, data_gen);    // steps done: 0 without --resume
  const int64_t end = a.stop_at > 0 ? std::min(a.stop_at, a.steps) : a.steps;
  const train::BatchPlan plan = train::plan_batches(a, corpus.cfg, pgm);
  train::Diagnostics diag(a, pgm, corpus, m, dp, *opt, start, end, plan.global_batch * corpus.cfg.block_size);

  // ---- the training loop ----------------------------------------------------------------
  for (int64_t step = start; step < end; ++step) {
    diag.step_begins(step);
    const double lr = optim::lr_at(step, a.lr, std::min(a.warmup, a.steps), a.steps, a.lr * a.min_lr_ratio);
    opt->set_lr(lr);
    // ZeRO: last step's all-gathered params are in place before this forward
    // (with --overlap-param-gather each layer waits for its own, in its forward
    // pre-hook; ZeRO-3 gathers each layer in its pre-hook and frees it after).
    opt->before_forward();
    dp.zero_grad(*m.chunks);         // at the top of the step, as picotron's train.py and llm.c do
    if (step == a.inject_overflow) train::inject_overflow(dp, pgm);  // a test aid: an inf in rank 0's gradient
    // This rank's rows of the global batch, as K micro-batches: gradient
    // accumulation, or the pipeline schedule (parallel/forward_backward.h);
    // only the last backward syncs gradients. Under fp16 each loss is also
    // multiplied by the loss scale before backward.
    data::Batch global = corpus.ds.sample("train", plan.global_batch, data_gen);
    if (corpus.eod >= 0) global = data::TextDataset::mask_loss_after(global, corpus.eod);  // --eod-mask-loss
    auto mbs = train::micro_batches(global, plan.first_row, a.batch, plan.micro_batches, pgm.cp_size, pgm.cp_rank);
    train::to_device(mbs, a);  // --device cuda: the tokens go to the GPU; the loss comes back in .item()
    nn::set_aux_loss_backward_scale(opt->backward_scale(), plan.micro_batches);  // --experts: as the loss is scaled
    if (teach::broken(teach::Break::MoeAuxUnscaled)) nn::set_aux_loss_backward_scale(opt->backward_scale(), 1);
    parallel::ForwardBackwardResult g =
        parallel::forward_backward(m, mbs, a.schedule, train::scaled_loss(m, *opt, mbs, corpus.eod >= 0, pgm),
                                   dp.dp.get(), a.overlap_pairs);
    finalize(dp.dp.get());  // tied embedding and sequence-parallel grads summed
    const double loss = train::global_mean_loss(g.loss, *opt, pgm);
    diag.backward_done();  // --memory-report's activation peak, before the optimizer allocates its state
    optim::StepResult stepped;
    {
      parallel::trace::Span span("optimizer step");
      stepped = opt->step();  // unscale, found_inf, clip, AdamW, main -> model params
    }
    parallel::update_router_biases(*m.chunks, pgm.dp_group());  // --router-bias-update-rate: the load over every replica
    // ---- TRAINING SECTION END: what follows reports, evaluates and saves; no number of the run changes
    diag.step_done(step, loss, lr, stepped, g.events);
    train::check_ranks_agree_on_skip(step, stepped, *opt, pgm);  // fp16: every rank skipped, or none did
    train::stop_if_diverged(step, loss, stepped);                // NaN never reaches a checkpoint
    if (a.save_every > 0 && (step + 1) % a.save_every == 0 && step + 1 < end)
      train::save(a, step + 1, corpus, m, *opt, data_gen, pgm);
  }
  diag.end_progress_line();
  train::save(a, end, corpus, m, *opt, data_gen, pgm);  // --save: a no-op without it
  train::export_hf(a, corpus, m, *opt, pgm);            // --export-hf: a no-op without it
  diag.finish();                                        // --trace, and a sample of generated text
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  train::Args a;
  CLI::App app{"train_gpt: train a character-level GPT with loom"};
  train::add_options(app, a);
  CLI11_PARSE(app, argc, argv);
  a.memory_report |= !a.memory_json.empty();  // --memory-json implies --memory-report
  // parallel::run: on a plain launch a world of one; under mpirun an exception on
  // any rank prints "[loom rank R] error: ..." and ends the whole job with exit 1.
  const std::string flags = app.config_to_str(/*default_also=*/true, /*write_description=*/false);
  return parallel::run(argc, argv, [&] { return run(a, flags); });
}
