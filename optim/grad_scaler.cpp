#include "optim/grad_scaler.h"

#include <cmath>

#include "autograd/functions.h"
#include "optim/grad_multi_tensor.h"

namespace loom::optim {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  LOOM_CHECK(options_.init_scale > 0 && std::isfinite(options_.init_scale),
             "GradScaler: init_scale must be finite and > 0, got ", options_.init_scale);
  LOOM_CHECK(options_.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ", options_.growth_factor);
  LOOM_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
             "GradScaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  LOOM_CHECK(options_.growth_interval > 0, "GradScaler: growth_interval must be > 0, got ",
             options_.growth_interval);
  LOOM_CHECK(options_.min_scale > 0 && options_.min_scale <= options_.init_scale,
             "GradScaler: min_scale must be in (0, init_scale ", options_.init_scale, "], got ", options_.min_scale);
}

Tensor GradScaler::scale_loss(const Tensor& loss) const { return autograd::mul(loss, scale_); }

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    ++consecutive_skips_;
    LOOM_CHECK(scale_ * options_.backoff_factor >= options_.min_scale, "loss scaling: the gradients overflowed in ",
               consecutive_skips_, " steps in a row and the loss scale would fall below its floor (", scale_, " x ",
               options_.backoff_factor, " < min_scale ", options_.min_scale,
               "): they overflow at any scale; stopping (a too-high --lr, or inf/nan in the data?)");
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  consecutive_skips_ = 0;
  if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

NamedTensors GradScaler::state_dict() const {
  return {{"scale", full({}, scale_, kFloat64)}, {"growth_tracker", full({}, double(growth_tracker_), kInt64)}};
}

void GradScaler::load_state_dict(const NamedTensors& state) {
  Tensor scale, tracker;
  for (const auto& [name, t] : state) {
    if (name == "scale") scale = t;
    if (name == "growth_tracker") tracker = t;
  }
  LOOM_CHECK(scale.defined() && scale.numel() == 1, "GradScaler::load_state_dict: entry 'scale' is missing");
  LOOM_CHECK(tracker.defined() && tracker.numel() == 1,
             "GradScaler::load_state_dict: entry 'growth_tracker' is missing");
  scale_ = scale.item<double>();
  growth_tracker_ = tracker.item<int64_t>();
}

// One launch for all the grads under LOOM_CUDA_KERNELS=fast on a GPU (grad_multi_tensor.h), the same bits.
bool unscale_(const std::vector<Tensor>& grads, double inv_scale) { return unscale_grads(grads, inv_scale); }

}  // namespace loom::optim
