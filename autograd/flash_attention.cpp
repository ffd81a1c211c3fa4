// The backward keeps q, k, v, o and lse: O(T) per row, where the composition
// keeps the [B, H, T, T] attention weights.
#include "autograd/flash_attention.h"

#include "autograd/function.h"

namespace loom::autograd {

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  ops::FlashAttentionResult r = ops::flash_attention(q, k, v, scale);
  return record("FlashAttentionBackward", {&q, &k, &v}, r.o,
                [q, k, v, o = r.o.alias(), lse = r.lse, scale](const TensorList& g) {
                  ops::FlashAttentionGrads d = ops::flash_attention_backward(g[0], q, k, v, o, lse, scale);
                  return TensorList{d.dq, d.dk, d.dv};
                });
}

}  // namespace loom::autograd
