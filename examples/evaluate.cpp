#include "examples/evaluate.h"

#include "parallel/context_parallel/zigzag.h"
#include "parallel/forward_backward.h"
#include "tensor/ops.h"

namespace loom::train {

double evaluate(parallel::Model& m, const data::TextDataset& ds, const EvalBatches& eb, parallel::ProcessGroup* cp) {
  m.chunks->eval();
  Generator gen(eb.seed);
  const Device device = m.chunks->parameters().front().device();  // --device cuda: the batches go to the GPU
  std::vector<parallel::MicroBatch> mbs;
  for (int64_t i = 0; i < eb.batches; ++i) {
    data::Batch b = ds.sample("val", eb.batch, gen);
    if (cp) b = {parallel::zigzag_take(b.x, 1, cp->size(), cp->rank()), parallel::zigzag_take(b.y, 1, cp->size(), cp->rank())};
    mbs.push_back({ops::to(b.x, device), ops::to(b.y, device)});
  }
  Tensor loss = full({}, parallel::forward_only(m, mbs), kFloat64);
  if (cp) cp->all_reduce(loss, parallel::ReduceOp::Avg);
  m.chunks->train();
  return loss.item<double>();
}

}  // namespace loom::train
