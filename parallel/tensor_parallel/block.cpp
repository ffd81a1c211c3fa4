#include "parallel/tensor_parallel/block.h"

#include "autograd/functions.h"
#include "parallel/teach/teach_break.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

Tensor qkv_rows_by_rank(const Tensor& w, int tp_size, int64_t kv_rows) {
  const int64_t kv = kv_rows > 0 ? kv_rows : w.size(0) / 3, C = w.size(0) - 2 * kv;
  const int64_t n = C / tp_size, n_kv = kv / tp_size;
  std::vector<Tensor> parts;
  for (int r = 0; r < tp_size; ++r) {
    int64_t kv0 = r * n_kv;                                      // the kv heads rank r's query heads read
    if (teach::broken(teach::Break::TpKvRowsOfRankZero)) kv0 = 0;  // --teach-break tp-kv-rows-of-rank-0: another group's
    parts.push_back(ops::narrow(w, 0, r * n, n));               // q rows of rank r's heads
    parts.push_back(ops::narrow(w, 0, C + kv0, n_kv));           // k rows of its kv heads
    parts.push_back(ops::narrow(w, 0, C + kv + kv0, n_kv));      // v rows
  }
  return ops::cat(parts, 0);
}

TensorParallelAttention::TensorParallelAttention(const nn::CausalSelfAttention& full, ProcessGroup& tp, bool sp) {
  LOOM_CHECK(full.attn_dropout->p == 0 && full.resid_dropout->p == 0,
             "tensor parallel attention: dropout is not supported with tp > 1 yet (got p = ", full.attn_dropout->p, ")");
  local_heads = full.n_head / tp.size();
  local_kv_heads = full.n_kv_head / tp.size();
  head_dim = full.n_embd / full.n_head;
  rope_base = full.rope_base;
  const int64_t kv = full.n_kv_head * head_dim;
  const Tensor& w = full.c_attn->weight;
  const Tensor& b = full.c_attn->bias;
  c_attn = register_module("c_attn", std::make_shared<ColumnParallelLinear>(
                                         qkv_rows_by_rank(w, tp.size(), kv),
                                         b.defined() ? ops::view(qkv_rows_by_rank(ops::unsqueeze(b, 1), tp.size(), kv), {-1})
                                                     : Tensor(),
                                         tp, /*gather_output=*/false, sp));
  c_proj = register_module("c_proj",
                           std::make_shared<RowParallelLinear>(full.c_proj->weight, full.c_proj->bias, tp, sp));
}

Tensor TensorParallelAttention::forward(const Tensor& x) {
  using namespace loom::autograd;
  Tensor qkv = c_attn->forward(x);  // [B, T, 3C/tp] ((H + 2 Hkv) hd / tp): this rank's heads, all T
  const int64_t B = qkv.size(0), T = qkv.size(1), H = local_heads, Hkv = local_kv_heads, hd = head_dim, c = H * hd;
  // q: [B, T, C/tp], k, v: [B, T, Hkv hd / tp]
  TensorList parts = Hkv == H ? split(qkv, c, 2)
                              : TensorList{narrow(qkv, 2, 0, c), narrow(qkv, 2, c, Hkv * hd),
                                           narrow(qkv, 2, c + Hkv * hd, Hkv * hd)};
  auto heads = [&](const Tensor& t, int64_t h) { return transpose(reshape(t, {B, T, h, hd}), 1, 2); };  // [B, h, T, hd]
  Tensor q = heads(parts[0], H), k = heads(parts[1], Hkv), v = heads(parts[2], Hkv);
  if (rope_base > 0)  // whole T on every tp rank: positions 0..T-1, or --cp's zig-zag chunks (rope_pos0)
    q = nn::rope_chunks(q, rope_base, rope_pos0), k = nn::rope_chunks(k, rope_base, rope_pos0);
  Tensor y = core(q, nn::repeat_kv(k, H / Hkv), nn::repeat_kv(v, H / Hkv), nullptr);  // this rank's heads
  y = reshape(transpose(y, 1, 2), {B, T, c});  // [B, T, C/tp]
  return c_proj->forward(y);                   // g: the heads' shares summed
}

TensorParallelMLP::TensorParallelMLP(const nn::MLP& full, ProcessGroup& tp, bool sp) {
  LOOM_CHECK(full.dropout->p == 0, "tensor parallel MLP: dropout is not supported with tp > 1 yet");
  if (full.swiglu)
    c_gate = register_module("c_gate", std::make_shared<ColumnParallelLinear>(full.c_gate->weight, full.c_gate->bias,
                                                                             tp, /*gather_output=*/false, sp));
  c_fc = register_module("c_fc", std::make_shared<ColumnParallelLinear>(full.c_fc->weight, full.c_fc->bias, tp,
                                                                         /*gather_output=*/false, sp));
  c_proj = register_module("c_proj",
                           std::make_shared<RowParallelLinear>(full.c_proj->weight, full.c_proj->bias, tp, sp));
}

Tensor TensorParallelMLP::forward(const Tensor& x) {
  using namespace loom::autograd;
  // SwiGLU: the gate and up columns of one rank are the same hidden units, so the product is local.
  Tensor h = c_gate ? silu(c_gate->forward(x)) * c_fc->forward(x) : c_fc->forward_gelu(x);  // gelu(c_fc(x)), one op
  return c_proj->forward(h);
}

TensorParallelBlock::TensorParallelBlock(const nn::Block& full, ProcessGroup& tp, bool sp) {
  ln_1 = register_module("ln_1", full.ln_1->copy());  // a LayerNorm or an RMSNorm, replicated
  attn = register_module("attn", std::make_shared<TensorParallelAttention>(*full.attn, tp, sp));
  ln_2 = register_module("ln_2", full.ln_2->copy());
  if (!full.moe) {
    mlp = register_module("mlp", std::make_shared<TensorParallelMLP>(*full.mlp, tp, sp));
    return;
  }
  moe = register_module("moe", full.moe->copy_routed());  // the router and experts whole (see block.h)
  if (full.moe->shared_experts)
    moe->shared_experts = moe->register_module(
        "shared_experts",
        std::make_shared<TensorParallelMLP>(static_cast<const nn::MLP&>(*full.moe->shared_experts), tp, sp));
}

Tensor TensorParallelBlock::forward(const Tensor& x) {
  using namespace loom::autograd;
  Tensor h = x + attn->forward(ln_1->forward(x));
  const Tensor n = ln_2->forward(h);  // [B, T, C], or [B, T/tp, C] under sequence parallelism
  return h + (moe ? moe->forward(n) : mlp->forward(n));
}

std::vector<Tensor> TensorParallelBlock::replicated_params() const {
  std::vector<Tensor> out;
  for (const Tensor& p : {ln_1->weight, ln_1->bias, attn->c_proj->bias, ln_2->weight, ln_2->bias,
                         mlp ? mlp->c_proj->bias : Tensor()})
    if (p.defined()) out.push_back(p);  // Llama's blocks have no biases
  if (moe)
    for (const auto& [name, p] : moe->named_parameters())
      if (name.rfind("shared_experts.", 0) != 0) out.push_back(p);  // the router and the routed experts
  return out;
}

}  // namespace loom::parallel
