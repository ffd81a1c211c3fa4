// Rotary position embeddings (RoPE, Su et al. 2021) on one row of hd values,
// Llama's "rotate half" layout (transformers' apply_rotary_pos_emb): the pairs
// are (i, i + hd/2), not neighbours. A row at position p, h = hd / 2:
//   y[i]     = x[i]     cos(p θ_i) - x[i + h] sin(p θ_i)
//   y[i + h] = x[i + h] cos(p θ_i) + x[i]     sin(p θ_i),   θ_i = base^(-2i / hd)
// i.e. y = x cos + rotate_half(x) sin with rotate_half(x) = [-x2, x1]. The
// rotation is orthogonal, so its backward is the rotation by -p θ_i (sign -1).
// cos and sin are this row's h values (rope_angle, filled once per call).
#pragma once

#include <cmath>

#include "tensor/macros.h"

namespace loom::kernels {

// p θ_i in double (transformers computes it in float32; the difference is a few
// 1e-7 radians for the positions tests use).
LOOM_HOST_DEVICE double rope_angle(long pos, long i, long hd, double base) {
  return double(pos) * std::pow(base, -2.0 * double(i) / double(hd));
}

template <class T>
LOOM_HOST_DEVICE void rope_row(const T* x, T* y, long hd, const T* cos, const T* sin, T sign) {
  const long h = hd / 2;
  for (long i = 0; i < h; ++i) {
    const T a = x[i], b = x[i + h], c = cos[i], s = sign * sin[i];
    y[i] = a * c - b * s;
    y[i + h] = b * c + a * s;
  }
}

}  // namespace loom::kernels
