#include "train/evaluate.h"

#include "parallel/context_parallel/zigzag.h"
#include "parallel/forward_backward.h"
#include "parallel/per_token_loss.h"
#include "tensor/ops.h"

namespace loom::train {

double evaluate(parallel::Model& m, const data::TextDataset& ds, const EvalBatches& eb, parallel::ProcessGroup* cp) {
  m.chunks->eval();
  Generator gen(eb.seed);
  const Device device = m.chunks->parameters().front().device();  // --device cuda: the batches go to the GPU
  std::vector<parallel::MicroBatch> mbs;
  for (int64_t i = 0; i < eb.batches; ++i) {
    data::Batch b = ds.sample("val", eb.batch, gen);
    if (eb.eod >= 0) b = data::TextDataset::mask_loss_after(b, eb.eod);
    if (cp) b = {parallel::zigzag_take(b.x, 1, cp->size(), cp->rank()), parallel::zigzag_take(b.y, 1, cp->size(), cp->rank())};
    mbs.push_back({ops::to(b.x, device), ops::to(b.y, device)});
  }
  double mean = 0;
  if (eb.eod < 0) {
    mean = parallel::forward_only(m, mbs);
  } else {  // the mean over every kept target of the cp ranks' chunks (parallel/per_token_loss.h)
    parallel::ModelChunks& chunks = *m.chunks;
    auto loss = [&chunks](const Tensor& logits, const Tensor& y) { return chunks.loss(logits, y); };
    mean = parallel::forward_only(
        m, mbs, parallel::per_token_loss(loss, parallel::global_target_count(mbs, cp), cp ? cp->size() : 1, eb.batches));
  }
  Tensor loss = full({}, mean, kFloat64);
  if (cp) cp->all_reduce(loss, parallel::ReduceOp::Avg);
  m.chunks->train();
  return loss.item<double>();
}

}  // namespace loom::train
