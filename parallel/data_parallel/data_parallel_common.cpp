#include "parallel/data_parallel/data_parallel_common.h"

#include <unordered_set>

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

std::vector<Tensor> unique_params(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : params) {
    LOOM_CHECK(p.defined(), "data parallel: parameter ", out.size(), " is undefined");
    if (seen.insert(p.impl()).second) out.push_back(p);
  }
  return out;
}

std::vector<Tensor> unique_params(const NamedParams& named) {
  std::vector<Tensor> params;
  for (const auto& [name, p] : named) {
    LOOM_CHECK(p.defined(), "data parallel: parameter ", name, " is undefined");
    params.push_back(p);
  }
  return unique_params(params);
}

bool ExpertParams::holds(const Tensor& p) const {
  for (const Tensor& e : params)
    if (e.impl() == p.impl()) return true;
  return false;
}

Tensor DataParallel::grad_of(const Tensor& param) const { return autograd::grad(param); }

void all_reduce_coalesced(const std::vector<Tensor>& tensors, ProcessGroup& group) {
  if (tensors.empty()) return;
  NoGradGuard no_grad;
  int64_t total = 0;
  for (const Tensor& t : tensors) total += t.numel();
  Tensor flat = empty({total}, tensors.front().dtype(), tensors.front().device());  // [total]
  auto copy = [&](bool into_flat) {
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      Tensor part = ops::view(ops::narrow(flat, 0, offset, t.numel()), t.shape());
      ops::copy_(into_flat ? part : t, into_flat ? t : part);
      offset += t.numel();
    }
  };
  copy(/*into_flat=*/true);
  group.all_reduce(flat, ReduceOp::Sum);
  copy(/*into_flat=*/false);
}

void broadcast_params(const std::vector<Tensor>& params, ProcessGroup& group) {
  // Queue them all, then wait: the group runs them back to back.
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& p : params) works.push_back(group.broadcast_async(p, /*root=*/0));
  for (auto& w : works) w->wait();
}

}  // namespace loom::parallel
