#include "optim/mixed_precision_optimizer.h"

#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "autograd/variable.h"
#include "optim/clip_grad.h"
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
  std::unordered_set<const TensorImpl*> skip;
  for (const Tensor& p : options_.not_counted) skip.insert(p.impl());
  for (MainParam& m : mains_) {
    LOOM_CHECK(m.main.dtype() == kFloat32 && m.main.numel() == m.end - m.start,
               "MixedPrecisionOptimizer: main param of ", m.model_param.describe(), " for [", m.start, ", ", m.end,
               ") is ", m.main.describe());
    if (skip.count(m.model_param.impl())) m.counted_in_norm = false;
  }
  if (options_.loss_scaling) scaler_ = std::make_unique<GradScaler>(options_.scaler);
  build_inner();
}

MixedPrecisionOptimizer::~MixedPrecisionOptimizer() = default;

void MixedPrecisionOptimizer::build_inner() {
  // The inner AdamW sees only fp32 main tensors, in the model's param groups.
  std::vector<ParamGroup> inner_groups;
  for (const ParamGroup& g : groups_) inner_groups.push_back({{}, g.lr, g.weight_decay, g.name});
  for (const MainParam& m : mains_) {
    auto& params = inner_groups.at(m.group).params;
    inner_index_.emplace_back(m.group, params.size());
    params.push_back(m.main);
  }
  inner_ = std::make_unique<AdamW>(std::move(inner_groups), options_.adam);
  // adam_step() puts the gradients of the mains it steps in active_grads_; the
  // others read as "no gradient" and AdamW leaves them (and their state) alone.
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < mains_.size(); ++i) index[mains_[i].main.impl()] = i;
  active_grads_.assign(mains_.size(), Tensor());
  inner_->set_grad_source([this, index](const Tensor& main) { return active_grads_[index.at(main.impl())]; });
}

const AdamWState& MixedPrecisionOptimizer::adam_state(size_t i) const {
  auto [g, j] = inner_index_.at(i);
  return inner_->state(g, j);
}

Tensor MixedPrecisionOptimizer::scale_loss(const Tensor& loss) const {
  return scaler_ ? scaler_->scale_loss(loss) : loss;
}

void MixedPrecisionOptimizer::set_lr(double lr) {
  LOOM_CHECK(lr >= 0, "MixedPrecisionOptimizer::set_lr: lr must be >= 0, got ", lr);
  for (ParamGroup& g : groups_) g.lr = lr;
  inner_->set_lr(lr);
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
    Tensor found_inf = full({1}, unscale_(defined, scaler_->inv_scale()) ? 1.0 : 0.0, kFloat32);
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

void MixedPrecisionOptimizer::adam_step(const std::vector<size_t>& which, const std::vector<Tensor>& grads) {
  for (size_t i : which) active_grads_[i] = grads[i];
  inner_->step();
  for (size_t i : which) active_grads_[i] = Tensor();
}

void MixedPrecisionOptimizer::copy_to_model(const std::vector<size_t>& which) {
  NoGradGuard no_grad;
  for (size_t i : which) {
    const MainParam& m = mains_[i];
    Tensor dst = flat_range(autograd::detach(m.model_param), m.start, m.end);
    if (dst.storage() == m.main.storage() && dst.offset() == m.main.offset()) continue;  // fp32: the same memory
    ops::copy_(dst, m.main);  // rounds to nearest even for bf16/fp16
  }
}

StepResult MixedPrecisionOptimizer::step() {
  NoGradGuard no_grad;
  StepResult result;
  std::vector<Tensor> grads(mains_.size());
  std::vector<size_t> all;
  for (size_t i = 0; i < mains_.size(); ++i) {
    grads[i] = main_grad(i);
    all.push_back(i);
  }
  if (!unscale_and_clip(grads, result)) return result;
  adam_step(all, grads);
  copy_to_model(all);
  return result;
}

void MixedPrecisionOptimizer::refresh_model_params() {
  std::vector<size_t> all(mains_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  copy_to_model(all);
}

}  // namespace loom::optim
