#include "optim/adamw.h"

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

// The dtype the moments are kept and the math is done in for a param dtype.
DType compute_dtype(DType param) { return param == kFloat64 ? kFloat64 : kFloat32; }

}  // namespace

void adamw_update(const Tensor& param, const AdamWState& st, const Tensor& grad, double lr, double weight_decay,
                  const AdamWOptions& o) {
  const int64_t step = ++st.step.data<int64_t>()[0];
  // The per-step scalars once, in double, then one fused pass over the param,
  // its moments and its gradient (llm.c's gpt2_update; ops::adamw_ on the param's device).
  if (param.dtype() == kFloat64)
    ops::adamw_(param, st.exp_avg, st.exp_avg_sq, grad,
                kernels::adamw_scalars<double>(lr, o.beta1, o.beta2, o.eps, weight_decay, step));
  else
    ops::adamw_(param, st.exp_avg, st.exp_avg_sq, grad,
                kernels::adamw_scalars<float>(lr, o.beta1, o.beta2, o.eps, weight_decay, step));
}

void check_adamw_options(const AdamWOptions& o) {
  LOOM_CHECK(o.beta1 >= 0 && o.beta1 < 1, "AdamW: beta1 must be in [0, 1), got ", o.beta1);
  LOOM_CHECK(o.beta2 >= 0 && o.beta2 < 1, "AdamW: beta2 must be in [0, 1), got ", o.beta2);
  LOOM_CHECK(o.eps >= 0, "AdamW: eps must be >= 0, got ", o.eps);
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups)), options_(options) {
  check_adamw_options(options_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<AdamWState>& states = state_.emplace_back();
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      // The fused loop walks raw memory; a strided param view would be updated wrongly.
      LOOM_CHECK(p.is_contiguous(), "AdamW: ", describe_param(g, i), " is not contiguous");
      DType dt = compute_dtype(p.dtype());
      states.push_back({zeros({}, kInt64), zeros(p.shape(), dt, p.device()), zeros(p.shape(), dt, p.device())});
    }
  }
}

void AdamW::step() {
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    LOOM_CHECK(group.params.size() == state_[g].size(), "AdamW::step: group ", g, " has ", group.params.size(),
               " params but the optimizer was built with ", state_[g].size());
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      const AdamWState& st = state_[g][i];
      Tensor grad = grad_of(p);
      if (!grad.defined()) continue;  // no gradient: param and state untouched (PyTorch)
      LOOM_CHECK(grad.shape() == p.shape(), "AdamW::step: ", describe_param(g, i), " has a gradient of shape ",
                 grad.shape());
      LOOM_CHECK(is_floating(p.dtype()), "AdamW::step: ", describe_param(g, i), " has unsupported dtype ",
                 dtype_name(p.dtype()));
      // The gradient in the compute dtype, contiguous (no copy for an fp32 grad of an fp32 param).
      adamw_update(p, st, ops::contiguous(ops::to(grad, st.exp_avg.dtype())), group.lr, group.weight_decay, options_);
    }
  }
}

NamedTensors AdamW::param_state(size_t group, size_t index) const {
  const AdamWState& st = state_[group][index];
  return {{"step", st.step}, {"exp_avg", st.exp_avg}, {"exp_avg_sq", st.exp_avg_sq}};
}

}  // namespace loom::optim
