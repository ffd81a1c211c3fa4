// Loss-scaling, one element (PyTorch's _amp_foreach_non_finite_check_and_unscale_):
// the gradient of (loss * scale) is multiplied back by 1/scale, and an
// overflow anywhere - an inf or nan - is noted, so the whole step can be
// skipped. Shared by the CPU loop (optim/grad_scaler.cpp) and a future CUDA kernel.
#pragma once

#include <cmath>

#include "tensor/macros.h"

namespace loom::kernels {

// g <- g * inv_scale; returns true when g was not finite (then the step is
// skipped and g's value does not matter).
LOOM_HOST_DEVICE bool unscale_and_check(float& g, float inv_scale) {
  bool bad = !std::isfinite(g);
  g *= inv_scale;
  return bad;
}

}  // namespace loom::kernels
