#include "optim/mixed_precision_optimizer.h"

#include <unordered_set>

#include "autograd/functions.h"
#include "autograd/variable.h"
#include "optim/adamw_updates.h"
#include "optim/clip_grad.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

Tensor flat_range(const Tensor& t, int64_t start, int64_t end) {
  LOOM_CHECK(t.is_contiguous(), "flat_range: ", t.describe(), " is not contiguous");
  LOOM_CHECK(0 <= start && start <= end && end <= t.numel(), "flat_range: [", start, ", ", end, ") is outside ",
             t.describe());
  return ops::narrow(ops::view(t, {t.numel()}), 0, start, end - start);
}

namespace {

// Every model param whole, with its fp32 main param: a view of the param itself
// when it is fp32, else an fp32 copy (Megatron's Float16OptimizerWithFloat16Params).
std::vector<MainParam> whole_params(const std::vector<ParamGroup>& groups) {
  std::vector<MainParam> mains;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) {
      Tensor data = autograd::detach(p);
      Tensor main = p.dtype() == kFloat32 ? flat_range(data, 0, p.numel())
                                          : ops::view(ops::to(data, kFloat32), {p.numel()});
      mains.push_back({p, 0, p.numel(), main, g, true});
    }
  return mains;
}

Optimizer::GradSource grad_as_fp32() {
  return [](const Tensor& p) {
    Tensor g = autograd::grad(p);
    return g.defined() ? ops::contiguous(ops::to(g, kFloat32)) : g;
  };
}

}  // namespace

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::vector<ParamGroup> groups, MixedPrecisionOptions options,
                                                 Optimizer::GradSource main_grad_of)
    : MixedPrecisionOptimizer(groups, whole_params(groups), std::move(options), std::move(main_grad_of)) {}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::vector<ParamGroup> groups, std::vector<MainParam> mains,
                                                 MixedPrecisionOptions options, Optimizer::GradSource main_grad_of)
    : groups_(std::move(groups)),
      mains_(std::move(mains)),
      options_(std::move(options)),
      main_grad_of_(main_grad_of ? std::move(main_grad_of) : grad_as_fp32()) {
  LOOM_CHECK(options_.max_grad_norm >= 0, "MixedPrecisionOptimizer: max_grad_norm must be >= 0, got ",
             options_.max_grad_norm);
  check_adamw_options(options_.adam);
  for (const ParamGroup& g : groups_)
    LOOM_CHECK(g.lr >= 0 && g.weight_decay >= 0, "MixedPrecisionOptimizer: group '", g.name, "' has lr ", g.lr,
               " and weight_decay ", g.weight_decay, "; both must be >= 0");
  std::unordered_set<const TensorImpl*> skip;
  for (const Tensor& p : options_.not_counted) skip.insert(p.impl());
  for (MainParam& m : mains_) {
    LOOM_CHECK(m.main.dtype() == kFloat32 && m.main.numel() == m.end - m.start && m.main.is_contiguous() &&
                   m.group < groups_.size(),
               "MixedPrecisionOptimizer: main param of ", m.model_param.describe(), " for [", m.start, ", ", m.end,
               ") in group ", m.group, " is ", m.main.describe());
    if (skip.count(m.model_param.impl())) m.counted_in_norm = false;
    // The moments live beside the main param (on its GPU with --device cuda); the step count on the host.
    const Device d = m.main.device();
    adam_.push_back({zeros({}, kInt64), zeros({m.end - m.start}, kFloat32, d), zeros({m.end - m.start}, kFloat32, d)});
  }
  if (options_.loss_scaling) scaler_ = std::make_unique<GradScaler>(options_.scaler);
}

MixedPrecisionOptimizer::~MixedPrecisionOptimizer() = default;

Tensor MixedPrecisionOptimizer::scale_loss(const Tensor& loss) const {
  return scaler_ ? autograd::mul(loss, backward_scale()) : loss;
}

double MixedPrecisionOptimizer::backward_scale() const {
  return scaler_ ? scaler_->scale() / double(options_.grad_mean_ranks) : 1.0;
}

void MixedPrecisionOptimizer::set_lr(double lr) {
  LOOM_CHECK(lr >= 0, "MixedPrecisionOptimizer::set_lr: lr must be >= 0, got ", lr);
  for (ParamGroup& g : groups_) g.lr = lr;
}

Tensor MixedPrecisionOptimizer::main_grad(size_t i) const {
  const MainParam& m = mains_[i];
  Tensor g = main_grad_of_(m.model_param);
  if (!g.defined()) return g;
  LOOM_CHECK(g.dtype() == kFloat32 && g.shape() == m.model_param.shape(), "MixedPrecisionOptimizer: the main grad "
             "of ", m.model_param.describe(), " is ", g.describe(), "; expected fp32 of the param's shape");
  return flat_range(g, m.start, m.end);
}

bool MixedPrecisionOptimizer::unscale_and_clip(const std::vector<Tensor>& grads, StepResult& result) {
  parallel::ProcessGroup* group = options_.grad_stats_group;
  std::vector<Tensor> defined;
  for (const Tensor& g : grads)
    if (g.defined()) defined.push_back(g);

  // 2-3. Loss scaling: unscale, then one found_inf flag per rank, all-reduced
  // (MAX) so that every stage and shard of the model takes the same decision.
  if (scaler_) {
    result.loss_scale = scaler_->scale();
    Tensor found_inf = full({1}, unscale_(defined, 1.0 / backward_scale()) ? 1.0 : 0.0, kFloat32);
    if (group) group->all_reduce(found_inf, parallel::ReduceOp::Max);
    const bool overflow = found_inf.item<float>() > 0;
    scaler_->update(overflow);
    if (overflow) {
      result.skipped = true;
      return false;
    }
  }
  // 4. The norm of the whole model's gradient: partial sums of squares add up
  // over the ranks (each element counted once: not_counted copies skipped).
  std::vector<Tensor> counted;
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined() && mains_[i].counted_in_norm) counted.push_back(grads[i]);
  result.grad_norm = global_grad_norm(counted, group);
  if (options_.max_grad_norm > 0) scale_grads_to_norm(defined, options_.max_grad_norm, result.grad_norm);
  return true;
}

void MixedPrecisionOptimizer::adam_step(size_t i, const Tensor& grad) {
  if (!grad.defined()) return;
  // AdamW's own update (adamw.h) on the fp32 main param [n], its moments [n] and its gradient [n].
  const MainParam& m = mains_[i];
  const ParamGroup& group = groups_[m.group];
  adamw_update(m.main, adam_[i], ops::contiguous(grad), group.lr, group.weight_decay, options_.adam);
}

void MixedPrecisionOptimizer::copy_to_model(size_t i) {
  NoGradGuard no_grad;
  const MainParam& m = mains_[i];
  Tensor dst = flat_range(autograd::detach(m.model_param), m.start, m.end);
  if (dst.storage() == m.main.storage() && dst.offset() == m.main.offset()) return;  // fp32: the same memory
  ops::copy_(dst, m.main);  // rounds to nearest even for bf16/fp16
}

StepResult MixedPrecisionOptimizer::step() {
  NoGradGuard no_grad;
  StepResult result;
  std::vector<Tensor> grads(mains_.size());  // 1.
  for (size_t i = 0; i < mains_.size(); ++i) grads[i] = main_grad(i);
  if (!unscale_and_clip(grads, result)) return result;  // 2-4.
  // 5. adam_step's updates, in one launch on a GPU with LOOM_CUDA_KERNELS=fast (adamw_updates.h).
  std::vector<AdamWUpdate> updates;
  for (size_t i = 0; i < mains_.size(); ++i)
    if (grads[i].defined())
      updates.push_back({mains_[i].main, &adam_[i], ops::contiguous(grads[i]), groups_[mains_[i].group].lr,
                         groups_[mains_[i].group].weight_decay});
  adamw_updates(updates, options_.adam);
  for (size_t i = 0; i < mains_.size(); ++i) copy_to_model(i);  // 6.
  return result;
}

void MixedPrecisionOptimizer::refresh_model_params() {
  for (size_t i = 0; i < mains_.size(); ++i) copy_to_model(i);
}

}  // namespace loom::optim
