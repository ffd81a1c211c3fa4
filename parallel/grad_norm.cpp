#include "parallel/grad_norm.h"

#include <cmath>
#include <unordered_set>

#include "autograd/variable.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// sum_i g_i², accumulated in double (fp32 as is, other floating dtypes widened).
double sum_of_squares(const Tensor& g) {
  Tensor c = ops::contiguous(g.dtype() == kFloat64 ? g : ops::to(g, kFloat32));
  double s = 0;
  if (c.dtype() == kFloat64) {
    const double* x = c.data<double>();
    for (int64_t i = 0; i < c.numel(); ++i) s += x[i] * x[i];
  } else {
    const float* x = c.data<float>();
    for (int64_t i = 0; i < c.numel(); ++i) s += double(x[i]) * double(x[i]);
  }
  return s;
}

// Each param once (a tied weight may be listed twice on one rank).
std::vector<Tensor> unique(const std::vector<Tensor>& params) {
  std::unordered_set<const TensorImpl*> seen;
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    if (seen.insert(p.impl()).second) out.push_back(p);
  return out;
}

}  // namespace

double global_grad_norm(const std::vector<Tensor>& grads, ProcessGroup* group) {
  double local = 0;
  for (const Tensor& g : grads)
    if (g.defined()) local += sum_of_squares(g);
  if (!group) return std::sqrt(local);
  // The partial sums of squares add up to the whole model's (not the norms: |a|+|b| != |(a, b)|).
  Tensor total = full({}, local, kFloat64);
  group->all_reduce(total, ReduceOp::Sum);
  return std::sqrt(total.item<double>());
}

double grad_norm_model_parallel(const std::vector<Tensor>& params, ProcessGroup& model_parallel_group,
                                const std::vector<Tensor>& not_counted) {
  std::unordered_set<const TensorImpl*> skip;
  for (const Tensor& p : not_counted) skip.insert(p.impl());
  std::vector<Tensor> grads;
  for (const Tensor& p : unique(params))
    if (!skip.count(p.impl())) grads.push_back(autograd::grad(p));
  return global_grad_norm(grads, &model_parallel_group);
}

double clip_grad_norm_model_parallel(const std::vector<Tensor>& params, double max_norm,
                                     ProcessGroup& model_parallel_group, const std::vector<Tensor>& not_counted) {
  LOOM_CHECK(max_norm > 0, "clip_grad_norm_model_parallel: max_norm must be > 0, got ", max_norm);
  const double norm = grad_norm_model_parallel(params, model_parallel_group, not_counted);
  const double clip_coef = max_norm / (norm + 1e-6);
  if (clip_coef < 1.0) {  // only ever scale down (PyTorch clamps the coefficient at 1)
    NoGradGuard no_grad;
    for (const Tensor& p : unique(params)) {
      Tensor g = autograd::grad(p);
      if (g.defined()) ops::mul_(g, clip_coef);
    }
  }
  return norm;
}

}  // namespace loom::parallel
