#include "parallel/per_token_loss.h"

#include "autograd/functions.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace loom::parallel {

int64_t target_count(const Tensor& targets, int64_t ignore_index) {
  Tensor t = ops::contiguous(ops::to(targets, kCPU));
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += t.data<int64_t>()[i] != ignore_index;
  return n;
}

int64_t global_target_count(const std::vector<MicroBatch>& micro_batches, ProcessGroup* group) {
  int64_t local = 0;
  for (const MicroBatch& mb : micro_batches) local += target_count(mb.y);
  Tensor n = full({}, double(local), kFloat64);  // exact below 2^53 tokens
  if (group && group->size() > 1) group->all_reduce(n, ReduceOp::Sum);
  return int64_t(n.item<double>());
}

LossFn per_token_loss(LossFn mean_loss, int64_t global_count, int ranks, int64_t micro_batches) {
  return [mean_loss = std::move(mean_loss), global_count, scale = double(ranks) * double(micro_batches)](
             const Tensor& logits, const Tensor& y) {
    const int64_t count = target_count(y);
    if (count == 0 || global_count == 0) return autograd::mul(autograd::sum(logits), 0.0);
    const double w = double(count) * scale / double(global_count);
    Tensor loss = mean_loss(logits, y);
    return w == 1.0 ? loss : autograd::mul(loss, w);
  };
}

}  // namespace loom::parallel
