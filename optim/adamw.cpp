#include "optim/adamw.h"

#include <type_traits>

#include "tensor/cuda/cuda_ops.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/parallel.h"

namespace loom::optim {

namespace {

// The dtype the moments are kept and the math is done in for a param dtype.
DType compute_dtype(DType param) { return param == kFloat64 ? kFloat64 : kFloat32; }

// Storage <-> compute conversions for the param (bf16/fp16 round to nearest even).
template <class T> T load(float x) { return T(x); }
template <class T> T load(double x) { return T(x); }
template <class T> T load(bfloat16 x) { return T(bf16_to_float(x)); }
template <class T> T load(float16 x) { return T(fp16_to_float(x)); }
template <class P, class T> P store(T x) {
  if constexpr (std::is_same_v<P, bfloat16>) return float_to_bf16(float(x));
  else if constexpr (std::is_same_v<P, float16>) return float_to_fp16(float(x));
  else return P(x);
}

// The fused loop over elements [b, e) of one param. P is the param's storage
// type, T the compute type of the moments and the gradient.
template <class P, class T>
void adamw_chunk(P* __restrict p, T* __restrict m, T* __restrict v, const T* __restrict g, int64_t b, int64_t e,
                 const kernels::AdamWScalars<T>& scalars) {
  const kernels::AdamWScalars<T> s = scalars;  // a local copy: the stores below cannot alias it
  for (int64_t i = b; i < e; ++i) {
    T x = load<T>(p[i]);
    kernels::adamw_update(x, m[i], v[i], g[i], s);
    p[i] = store<P>(x);
  }
}

// All n elements, split over the math threads: each element's update reads
// and writes only its own p, m, v, so the bits are the same at any thread
// count. (One thread below ~32k elements: the biases and layernorm params.)
template <class P, class T>
void adamw_loop(P* p, T* m, T* v, const T* g, int64_t n, const kernels::AdamWScalars<T>& s) {
  parallel_for(n, int64_t(1) << 15, [&](int64_t b, int64_t e) { adamw_chunk<P, T>(p, m, v, g, b, e, s); });
}

// One param's update: the per-step scalars in double, then the fused loop.
template <class P, class T>
void adamw_param(const Tensor& p, const AdamWState& st, const Tensor& grad, const ParamGroup& group,
                 const AdamWOptions& o, int64_t step) {
  auto s = kernels::adamw_scalars<T>(group.lr, o.beta1, o.beta2, o.eps, group.weight_decay, step);
  if (p.device().is_cuda()) return cuda::adamw_update(p, st.exp_avg, st.exp_avg_sq, grad, s);  // the same element math
  if constexpr (std::is_same_v<P, float>)
    adamw_fp32(p.data<float>(), st.exp_avg.data<float>(), st.exp_avg_sq.data<float>(), grad.data<float>(), p.numel(),
               s);
  else
    adamw_loop<P, T>(p.data<P>(), st.exp_avg.data<T>(), st.exp_avg_sq.data<T>(), grad.data<T>(), p.numel(), s);
}

}  // namespace

void adamw_fp32(float* param, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n,
                const kernels::AdamWScalars<float>& s) {
  adamw_loop<float, float>(param, exp_avg, exp_avg_sq, grad, n, s);
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
      // The gradient in the compute dtype, contiguous (no copy for an fp32 grad of an fp32 param).
      grad = ops::contiguous(ops::to(grad, st.exp_avg.dtype()));
      int64_t step = ++st.step.data<int64_t>()[0];
      switch (p.dtype()) {
        case DType::Float32: adamw_param<float, float>(p, st, grad, group, options_, step); break;
        case DType::BFloat16: adamw_param<bfloat16, float>(p, st, grad, group, options_, step); break;
        case DType::Float16: adamw_param<float16, float>(p, st, grad, group, options_, step); break;
        case DType::Float64: adamw_param<double, double>(p, st, grad, group, options_, step); break;
        default: throw Error(str("AdamW::step: ", describe_param(g, i), " has unsupported dtype ",
                                 dtype_name(p.dtype())));
      }
    }
  }
}

NamedTensors AdamW::param_state(size_t group, size_t index) const {
  const AdamWState& st = state_[group][index];
  return {{"step", st.step}, {"exp_avg", st.exp_avg}, {"exp_avg_sq", st.exp_avg_sq}};
}

}  // namespace loom::optim
