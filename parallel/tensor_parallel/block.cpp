#include "parallel/tensor_parallel/block.h"

#include "autograd/functions.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

Tensor qkv_rows_by_rank(const Tensor& w, int tp_size) {
  const int64_t C = w.size(0) / 3, n = C / tp_size;
  std::vector<Tensor> parts;
  for (int r = 0; r < tp_size; ++r)
    for (int64_t which = 0; which < 3; ++which) parts.push_back(ops::narrow(w, 0, which * C + r * n, n));
  return ops::cat(parts, 0);
}

TensorParallelAttention::TensorParallelAttention(const nn::CausalSelfAttention& full, ProcessGroup& tp, bool sp) {
  LOOM_CHECK(full.n_head % tp.size() == 0, "tensor parallel attention: ", full.n_head, " heads do not split over tp = ",
             tp.size(), " ranks");
  LOOM_CHECK(full.attn_dropout->p == 0 && full.resid_dropout->p == 0,
             "tensor parallel attention: dropout is not supported with tp > 1 yet (got p = ", full.attn_dropout->p, ")");
  local_heads = full.n_head / tp.size();
  head_dim = full.n_embd / full.n_head;
  const Tensor& w = full.c_attn->weight;
  const Tensor& b = full.c_attn->bias;
  c_attn = register_module("c_attn", std::make_shared<ColumnParallelLinear>(
                                         qkv_rows_by_rank(w, tp.size()),
                                         b.defined() ? ops::view(qkv_rows_by_rank(ops::unsqueeze(b, 1), tp.size()), {-1})
                                                     : Tensor(),
                                         tp, /*gather_output=*/false, sp));
  c_proj = register_module("c_proj",
                           std::make_shared<RowParallelLinear>(full.c_proj->weight, full.c_proj->bias, tp, sp));
}

Tensor TensorParallelAttention::forward(const Tensor& x) {
  using namespace loom::autograd;
  Tensor qkv = c_attn->forward(x);  // [B, T, 3C/tp]: this rank's heads, all T
  const int64_t B = qkv.size(0), T = qkv.size(1), H = local_heads, hd = head_dim, c = H * hd;
  TensorList parts = split(qkv, c, 2);  // q, k, v: [B, T, C/tp]
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, hd}), 1, 2); };  // [B, H/tp, T, hd]
  Tensor y = core(heads(parts[0]), heads(parts[1]), heads(parts[2]), nullptr);  // this rank's heads
  y = reshape(transpose(y, 1, 2), {B, T, c});  // [B, T, C/tp]
  return c_proj->forward(y);                   // g: the heads' shares summed
}

TensorParallelMLP::TensorParallelMLP(const nn::MLP& full, ProcessGroup& tp, bool sp) {
  LOOM_CHECK(full.dropout->p == 0, "tensor parallel MLP: dropout is not supported with tp > 1 yet");
  c_fc = register_module("c_fc", std::make_shared<ColumnParallelLinear>(full.c_fc->weight, full.c_fc->bias, tp,
                                                                         /*gather_output=*/false, sp));
  c_proj = register_module("c_proj",
                           std::make_shared<RowParallelLinear>(full.c_proj->weight, full.c_proj->bias, tp, sp));
}

Tensor TensorParallelMLP::forward(const Tensor& x) { return c_proj->forward(autograd::gelu(c_fc->forward(x))); }

TensorParallelBlock::TensorParallelBlock(const nn::Block& full, ProcessGroup& tp, bool sp) {
  auto copy_ln = [](const nn::LayerNorm& ln) {
    auto out = std::make_shared<nn::LayerNorm>(ln.weight.size(0), ln.eps);
    NoGradGuard no_grad;  // filling fresh parameters, not a step of the graph
    ops::copy_(out->weight, ln.weight);
    ops::copy_(out->bias, ln.bias);
    return out;
  };
  ln_1 = register_module("ln_1", copy_ln(*full.ln_1));
  attn = register_module("attn", std::make_shared<TensorParallelAttention>(*full.attn, tp, sp));
  ln_2 = register_module("ln_2", copy_ln(*full.ln_2));
  mlp = register_module("mlp", std::make_shared<TensorParallelMLP>(*full.mlp, tp, sp));
}

Tensor TensorParallelBlock::forward(const Tensor& x) {
  using namespace loom::autograd;
  Tensor h = x + attn->forward(ln_1->forward(x));
  return h + mlp->forward(ln_2->forward(h));
}

std::vector<Tensor> TensorParallelBlock::replicated_params() const {
  return {ln_1->weight, ln_1->bias, attn->c_proj->bias, ln_2->weight, ln_2->bias, mlp->c_proj->bias};
}

}  // namespace loom::parallel
