// GradScaler: dynamic loss scaling for fp16 training (Micikevicius et al.
// 2018, "Mixed Precision Training"; torch.cuda.amp.GradScaler; Megatron's
// DynamicGradScaler).
//
// fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. Multiplying
// the loss by a large scale S before backward multiplies every gradient by S
// and lifts them into fp16's range; the optimizer divides by S again (in fp32,
// on the main grads) before clipping and the update. Too large an S overflows
// instead: some gradient becomes inf/nan. Then the step is skipped - params and
// optimizer state untouched - and S is halved. After growth_interval clean
// steps in a row, S doubles, to probe for the largest scale that fits.
//
//   loss = scaler.scale_loss(loss);  backward(loss);
//   bool found_inf = unscale_(main_grads, scaler.inv_scale());  // + all-reduce MAX over the model
//   if (!found_inf) step();
//   scaler.update(found_inf);
//
// bf16 has fp32's exponent range and needs no scaling.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

namespace loom::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps before the scale grows
  // A scale that an overflow would push below min_scale means the gradients
  // overflow at any scale (an exploding lr, a NaN in the data): update() stops
  // the run with an error instead of skipping steps forever.
  double min_scale = 1.0;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // clean steps since the last change
  int64_t consecutive_skips() const { return consecutive_skips_; }  // overflowing steps in a row

  // loss * scale, recorded for backward.
  Tensor scale_loss(const Tensor& loss) const;

  // After the step decision: backoff on an overflow, growth after
  // growth_interval clean steps in a row. Throws when an overflow would take
  // the scale below min_scale (the message counts the skipped steps in a row).
  void update(bool found_inf);

  // "scale" (float64 []) and "growth_tracker" (int64 []), for checkpoints.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);  // clear error on a missing entry

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t consecutive_skips_ = 0;
};

// Multiplies every tensor (fp32, contiguous) by inv_scale in place; returns
// true if any element was inf or nan before. This rank's flag only: the caller
// all-reduces it (MAX) so every rank of the model takes the same decision.
bool unscale_(const std::vector<Tensor>& grads, double inv_scale);

}  // namespace loom::optim
