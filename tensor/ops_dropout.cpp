// Inverted dropout from a counter-based generator. The mask of element i of a
// call is a pure function of (seed, offset, i) (tensor/kernels/philox.h), so
//   - the CPU loop may split the elements over any number of threads,
//   - the CUDA kernel (cuda/dropout.cu) draws the very same mask,
//   - and a generator's state is two integers, saved in checkpoints.
// Each block of 4 elements is one Philox call: element i takes word i % 4 of
// block i / 4.
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/parallel.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/kernels/philox.h"
#include "tensor/ops.h"

namespace loom::ops {

Tensor dropout_mask(const Shape& shape, DType dtype, const Device& device, double p, uint64_t seed,
                    uint64_t offset) {
  LOOM_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  LOOM_CHECK(is_floating(dtype), "dropout: expected a floating dtype, got ", dtype_name(dtype));
  Tensor mask = empty(shape, dtype, device);  // contiguous
  const uint32_t threshold = kernels::dropout_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  if (device.is_cuda()) {
    cuda::dropout_mask(mask, seed, offset, threshold, scale);
    return mask;
  }
  check_device_supported("dropout", device);
  const int64_t n = mask.numel(), blocks = (n + 3) / 4;
  LOOM_DISPATCH_FLOAT(dtype, "dropout", {
    scalar_t* m = mask.data<scalar_t>();
    const scalar_t keep = cpu::from_acc<scalar_t>(scale), drop = cpu::from_acc<scalar_t>(0.0);
    cpu::parallel_for(blocks, 4096, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const kernels::Philox4 r = kernels::philox_block(seed, offset, uint64_t(b));
        for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j)
          m[4 * b + j] = kernels::dropout_keeps(r.w[j], threshold) ? keep : drop;
      }
    });
  });
  return mask;
}

std::pair<Tensor, Tensor> dropout(const Tensor& x, double p, PhiloxGenerator& gen) {
  LOOM_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  Tensor mask = dropout_mask(x.shape(), x.dtype(), x.device(), p, gen.seed, gen.next_offset());
  return {mul(x, mask), mask};
}

}  // namespace loom::ops
