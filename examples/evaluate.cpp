#include "examples/evaluate.h"

#include "nn/loss.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::train {

double evaluate(nn::GPT& model, const data::TextDataset& ds, const EvalBatches& eb) {
  NoGradGuard no_grad;
  model.eval();
  Generator gen(eb.seed);
  const Device device = model.parameters().front().device();  // --device cuda: the batches go to the GPU
  double total = 0;
  for (int64_t i = 0; i < eb.batches; ++i) {
    data::Batch b = ds.sample("val", eb.batch, gen);
    total += nn::cross_entropy_loss(model.forward(ops::to(b.x, device)), ops::to(b.y, device)).item<double>();
  }
  model.train();
  return total / double(eb.batches);
}

double evaluate_pipeline(parallel::PipelineStage& stage, parallel::PipelineP2P& p2p, const data::TextDataset& ds,
                         const EvalBatches& eb) {
  NoGradGuard no_grad;
  stage.eval();
  Generator gen(eb.seed);
  const Device device = stage.parameters().front().device();  // --device cuda: the batches go to the GPU
  std::vector<parallel::MicroBatch> mbs;
  for (int64_t i = 0; i < eb.batches; ++i) {
    data::Batch b = ds.sample("val", eb.batch, gen);
    mbs.push_back({ops::to(b.x, device), ops::to(b.y, device)});
  }
  auto loss_fn = [&stage](const Tensor& logits, const Tensor& y) { return stage.loss(logits, y); };
  double loss = parallel::eval_step_pipeline(stage, p2p, mbs, loss_fn);
  stage.train();
  return loss;
}

}  // namespace loom::train
