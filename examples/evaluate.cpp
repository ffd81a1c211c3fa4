#include "examples/evaluate.h"

#include "parallel/forward_backward.h"
#include "tensor/ops.h"

namespace loom::train {

double evaluate(parallel::Model& m, const data::TextDataset& ds, const EvalBatches& eb) {
  m.chunks->eval();
  Generator gen(eb.seed);
  const Device device = m.chunks->parameters().front().device();  // --device cuda: the batches go to the GPU
  std::vector<parallel::MicroBatch> mbs;
  for (int64_t i = 0; i < eb.batches; ++i) {
    data::Batch b = ds.sample("val", eb.batch, gen);
    mbs.push_back({ops::to(b.x, device), ops::to(b.y, device)});
  }
  const double loss = parallel::forward_only(m, mbs);
  m.chunks->train();
  return loss;
}

}  // namespace loom::train
