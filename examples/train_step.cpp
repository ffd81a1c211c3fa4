#include "examples/train_step.h"

#include <cmath>
#include <limits>

#include "parallel/comm/handshake.h"
#include "parallel/context_parallel/zigzag.h"
#include "parallel/per_token_loss.h"
#include "parallel/teach/teach_break.h"

namespace loom::train {

int64_t micro_batches_per_step(const Args& a, parallel::ProcessGroupManager& pgm) {
  return pgm.pp_size() > 1 ? (a.microbatches > 0 ? a.microbatches : pgm.pp_size()) : a.grad_accum;
}

BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm) {
  LOOM_CHECK(pgm.pp_size() == 1 || a.grad_accum == 1, "--grad-accum does not combine with --pp; use --microbatches");
  const int64_t K = micro_batches_per_step(a, pgm);
  const BatchPlan plan{K, int64_t(pgm.dp_size()) * a.batch * K, int64_t(pgm.dp_rank()) * a.batch * K};
  say(pgm.global_rank() == 0,
      "batch: %lld sequences x %lld tokens per step (dp %d x micro-batch %lld x micro-batches %lld)\n",
      (long long)plan.global_batch, (long long)cfg.block_size, pgm.dp_size(), (long long)a.batch, (long long)K);
  return plan;
}

std::vector<parallel::MicroBatch> micro_batches(const data::Batch& global, int64_t first_row, int64_t batch,
                                                int64_t K, int cp, int cp_rank) {
  std::vector<parallel::MicroBatch> mbs;
  for (int64_t k = 0; k < K; ++k) {
    data::Batch b = data::TextDataset::slice(global, first_row + k * batch, batch);
    // --cp: this rank's zig-zag chunks of every sequence, [batch, T] -> [batch, T / cp]
    mbs.push_back({parallel::zigzag_take(b.x, 1, cp, cp_rank), parallel::zigzag_take(b.y, 1, cp, cp_rank)});
  }
  return mbs;
}

parallel::LossFn scaled_loss(parallel::Model& m, const optim::MixedPrecisionOptimizer& opt,
                             const std::vector<parallel::MicroBatch>& mbs, bool masked,
                             parallel::ProcessGroupManager& pgm) {
  parallel::LossFn loss = [&m](const Tensor& logits, const Tensor& y) { return m.chunks->loss(logits, y); };
  if (masked) {
    parallel::ProcessGroup& ranks = pgm.dp_cp_group();  // whose losses and gradients are averaged
    loss = parallel::per_token_loss(loss, parallel::global_target_count(mbs, &ranks), ranks.size(),
                                    int64_t(mbs.size()));
  }
  return [loss, &opt](const Tensor& logits, const Tensor& y) { return opt.scale_loss(loss(logits, y)); };
}

double global_mean_loss(double local_loss, const optim::MixedPrecisionOptimizer& opt,
                        parallel::ProcessGroupManager& pgm) {
  Tensor loss = full({}, local_loss / opt.backward_scale(), kFloat64);
  // The mean over every token of the global batch: each dp x cp rank's mean is over as many tokens.
  if (pgm.dp_cp_group().size() > 1) pgm.dp_cp_group().all_reduce(loss, parallel::ReduceOp::Avg);
  return loss.item<double>();
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

void inject_overflow(const parallel::DataParallelWrap& dp, parallel::ProcessGroupManager& pgm) {
  // Rank 0 and, under HSDP, its replicas: the inf is put into the reduced
  // grad shard, past the all-reduce over the replicas that would have carried it.
  const parallel::ProcessGrid::Coords c = pgm.grid().coords(pgm.global_rank());
  if (c.tp_rank || c.cp_rank || c.pp_rank || c.dp_shard_rank) return;
  // The gradient sync carries the inf only as far as its bucket's reduction
  // does (an all-reduce: the dp group; a ZeRO reduce-scatter: the element's
  // owner alone; never to other pipeline stages); found_inf's all-reduce must
  // make every rank skip. The last param, not the first: that is the tied
  // embedding, whose gradient the shared-weight handler would also carry to
  // the last stage.
  ops::fill_(dp.last_grad_element(), std::numeric_limits<double>::infinity());
}

}  // namespace loom::train
