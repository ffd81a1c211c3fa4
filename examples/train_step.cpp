#include "examples/train_step.h"

#include "parallel/context_parallel/zigzag.h"
#include "parallel/per_token_loss.h"
#include "train/say.h"

namespace loom::train {

BatchPlan plan_batches(const Args& a, const nn::GPTConfig& cfg, parallel::ProcessGroupManager& pgm) {
  LOOM_CHECK(pgm.pp_size == 1 || a.grad_accum == 1, "--grad-accum does not combine with --pp; use --microbatches");
  const int64_t K = micro_batches_per_step(a, pgm.pp_size);
  const BatchPlan plan{K, int64_t(pgm.dp_size) * a.batch * K, int64_t(pgm.dp_rank) * a.batch * K};
  say(pgm.global_rank == 0,
      "batch: %lld sequences x %lld tokens per step (dp %d x micro-batch %lld x micro-batches %lld)\n",
      (long long)plan.global_batch, (long long)cfg.block_size, pgm.dp_size, (long long)a.batch, (long long)K);
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

}  // namespace loom::train
