#include "optim/ring_activations.h"

#include <algorithm>

#include "optim/activation_moments.h"

namespace loom::optim {

double ring_math_bytes(const ActivationCase& c) { return c.element_bytes == 8 ? 8 : 4; }

double ring_kept_bytes(const ActivationCase& c, const Sizes& z) {
  if (c.cp <= 1) return 0;
  return z.N * (z.h + z.a) / z.t * ring_math_bytes(c);  // out [N, h/t] and lse [N, a/t]
}

double ring_token_bytes(const ActivationCase& c, const Sizes& z) {
  return c.cp > 1 ? 2 * z.N * 8 * double(c.micro_batches) : 0;  // ids and targets [b, s] int64, every micro-batch
}

double ring_backward_bytes(const ActivationCase& c, const Sizes& z) {
  const double m = ring_math_bytes(c), e = z.e, x = z.N * z.h / z.t;  // x: elements of one [N, h/t]
  const double copies = e == m ? 0 : 2 * x * m;                       // dout's and q's math copies
  const double held = x * e + copies + x * m + z.N * z.a / z.t * m + 2 * x * e;  // dO, dq, D, the K/V block
  // dK/dV: the step's, the one on its way, the arriving one; a middle step (cp > 2) the next K/V block too.
  const double buffers = 3 * 2 * x * m + (c.cp > 2 ? 2 * x * e : 0);
  // One block: a chunk c = s / 2 of queries against one of keys, [b, a/t, c, c] and [b, a/t, c, hd].
  const double c2 = z.b * z.a / z.t * (z.s / 2) * (z.s / 2) * m, chd = x / 2 * m;
  const double block = (e == m ? 0 : 2 * x / 2 * m) + std::max(4 * c2, 2 * c2 + chd);
  return held + buffers + block;
}

}  // namespace loom::optim
