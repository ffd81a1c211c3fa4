// Many AdamW updates at once: adamw_update (adamw.h) for each, except that
// with LOOM_CUDA_KERNELS=fast the GPU params of one dtype (fp32, bf16, fp16)
// go to the GPU in one launch (tensor/cuda/fast/adamw_multi_tensor.h) instead
// of one launch each. The math and the order of each param's updates are
// adamw_update's, so the results are the same bits either way; only the
// launch count changes. float64, CPU params and the reference kernels: one by
// one, as before.
#pragma once

#include <vector>

#include "optim/adamw.h"

namespace loom::optim {

struct AdamWUpdate {
  Tensor param;               // updated in place
  const AdamWState* state;    // its step is counted up, its moments updated
  Tensor grad;                // contiguous, of the moments' dtype
  double lr, weight_decay;
};

void adamw_updates(const std::vector<AdamWUpdate>& updates, const AdamWOptions& o);

}  // namespace loom::optim
