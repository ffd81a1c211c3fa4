// Causal self-attention, written out so a reader sees every step: project to
// q, k, v; split C into n_head heads of hd = C / n_head; scores = q kᵀ /
// sqrt(hd); hide the future (column > row) with -inf; softmax (the scale, the
// mask and the softmax are one fused op, causal_softmax); weight the values;
// merge the heads; project back. (Vaswani et al. 2017; the layout and names
// follow GPT-2 / nanoGPT.)
#pragma once

#include <cmath>

#include "nn/dropout.h"
#include "nn/linear.h"

namespace loom::nn {

struct CausalSelfAttention : Layer {
  int64_t n_embd, n_head;
  std::shared_ptr<Linear> c_attn;  // [3C, C]: q, k and v projections stacked
  std::shared_ptr<Linear> c_proj;  // [C, C], a residual projection
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;

  CausalSelfAttention(int64_t C, int64_t n_head, Generator& gen, double proj_std, double p_dropout = 0.0)
      : n_embd(C), n_head(n_head) {
    LOOM_CHECK(n_head > 0 && C % n_head == 0, "CausalSelfAttention: n_embd ", C, " is not divisible by n_head ",
               n_head);
    c_attn = register_module("c_attn", std::make_shared<Linear>(C, 3 * C, gen));
    c_proj = register_module("c_proj", std::make_shared<Linear>(C, C, gen, proj_std));
    attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
  }

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override {
    using namespace loom::autograd;
    LOOM_CHECK(x.dim() == 3 && x.size(2) == n_embd, "CausalSelfAttention: expected [B, T, ", n_embd, "], got ",
               x.shape());
    const int64_t B = x.size(0), T = x.size(1), C = n_embd, H = n_head, hd = C / H;

    Tensor qkv = c_attn->forward(x);          // [B, T, 3C]
    TensorList parts = split(qkv, C, 2);      // q, k, v: [B, T, C] each (views)
    auto heads = [&](const Tensor& t) {       // [B, T, C] -> [B, H, T, hd]
      return transpose(reshape(t, {B, T, H, hd}), 1, 2);
    };
    Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);

    // Every query against every key: [B, H, T, hd] @ [B, H, hd, T] -> [B, H, T, T].
    Tensor att = matmul(q, transpose(k, -2, -1));
    // Scale by 1/sqrt(hd), hide the future (token t sees keys 0..t only: the
    // others become -inf), softmax each row (it sums to 1 over the visible
    // keys). causal_softmax does the three in one pass; written out it is
    //   softmax(causal_mask_fill(att * scale, -inf)).
    att = causal_softmax(att, 1.0 / std::sqrt(double(hd)));
    att = attn_dropout->forward(att);

    Tensor y = matmul(att, v);                // [B, H, T, T] @ [B, H, T, hd] -> [B, H, T, hd]
    y = reshape(transpose(y, 1, 2), {B, T, C});  // merge heads: [B, T, H, hd] -> [B, T, C]
    return resid_dropout->forward(c_proj->forward(y));
  }
};

}  // namespace loom::nn
