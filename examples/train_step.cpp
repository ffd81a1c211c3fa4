#include "examples/train_step.h"

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "nn/loss.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"
#include "parallel/teach/teach_break.h"
#include "parallel/trace/trace.h"

namespace loom::train {

std::vector<data::Batch> micro_batches(const data::Batch& global, int64_t first_row, int64_t batch, int64_t K) {
  std::vector<data::Batch> mbs;
  for (int64_t k = 0; k < K; ++k) mbs.push_back(data::TextDataset::slice(global, first_row + k * batch, batch));
  return mbs;
}

double accumulate_gradients(nn::GPT& model, const std::vector<data::Batch>& mbs,
                            const optim::MixedPrecisionOptimizer& opt, parallel::DataParallel* dp) {
  const int64_t K = int64_t(mbs.size());
  double local_loss = 0;
  for (int64_t k = 0; k < K; ++k) {
    const data::Batch& mb = mbs[size_t(k)];
    auto forward_backward = [&] {
      Tensor loss;
      {
        parallel::trace::Span span("forward");
        loss = nn::cross_entropy_loss(model.forward(mb.x), mb.y);
      }
      parallel::trace::Span span("backward");
      autograd::backward(opt.scale_loss(K == 1 ? loss : autograd::mul(loss, 1.0 / double(K))));
      local_loss += loss.item<double>() / double(K);
    };
    if (dp && k + 1 < K) {
      auto no_sync = dp->no_sync();  // accumulate only; the last backward syncs the sum
      forward_backward();
    } else {
      forward_backward();
    }
  }
  return local_loss;
}

parallel::PipelineStepResult pipeline_gradients(parallel::PipelineStage& stage, parallel::PipelineP2P& p2p,
                                                const std::vector<data::Batch>& mbs, const std::string& schedule,
                                                const optim::MixedPrecisionOptimizer& opt, parallel::DataParallel* dp) {
  std::vector<parallel::MicroBatch> micro;
  for (const data::Batch& mb : mbs) micro.push_back({mb.x, mb.y});
  auto loss_fn = [&](const Tensor& logits, const Tensor& y) {
    return opt.scale_loss(stage.loss(logits, y));  // vocab-parallel with --tp
  };
  // --virtual-stages v > 1: a stage of v chunks, interleaved 1F1B.
  parallel::PipelineStepResult r =
      stage.num_chunks() > 1 ? parallel::train_step_pipeline_interleaved(stage, p2p, micro, loss_fn, dp)
      : schedule == "afab"   ? parallel::train_step_pipeline_afab(stage, p2p, micro, loss_fn, dp)
                             : parallel::train_step_pipeline_1f1b(stage, p2p, micro, loss_fn, dp);
  r.loss /= opt.scaler() ? opt.scaler()->scale() : 1.0;  // a power of two: exact
  return r;
}

StepGradients forward_backward(ModelOrStage& m, const std::vector<data::Batch>& mbs, const std::string& schedule,
                               const optim::MixedPrecisionOptimizer& opt, DataParallelWrap& dp,
                               parallel::SharedWeightGradHandler& tied) {
  if (!m.pipelined()) return {accumulate_gradients(*m.model, mbs, opt, dp.dp.get()), {}};
  parallel::PipelineStepResult r = pipeline_gradients(*m.stage, *m.p2p, mbs, schedule, opt, dp.dp.get());
  // After backward and the data-parallel sync. (--teach-break skip-tied-sync: the copies drift apart.)
  if (!teach::broken(teach::Break::SkipTiedSync)) tied.all_reduce_grads(dp.bucket);
  return {r.loss, std::move(r.events)};
}

double global_mean_loss(double local_loss, parallel::ProcessGroupManager& pgm) {
  Tensor loss = full({}, local_loss, kFloat64);
  if (pgm.dp_size() > 1) pgm.dp_group().all_reduce(loss, parallel::ReduceOp::Avg);
  return loss.item<double>();
}

}  // namespace loom::train
