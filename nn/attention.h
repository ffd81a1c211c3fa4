// Causal self-attention, written out so a reader sees every step: project to
// q, k, v; split C into n_head heads of hd = C / n_head; scores = q kᵀ /
// sqrt(hd); hide the future (column > row) with -inf; softmax (the scale, the
// mask and the softmax are one fused op, causal_softmax); weight the values;
// merge the heads; project back. (Vaswani et al. 2017; the layout and names
// follow GPT-2 / nanoGPT.) On the CPU the middle steps (scores, softmax,
// weighting) run as one op that skips the masked half of the work: attend()
// below says when.
//
// Llama's options (nn/block.h's BlockOptions): rotary position embeddings on q
// and k (Su et al. 2021) instead of learned positions, grouped-query attention
// (Ainslie et al. 2023: n_kv_head < n_head key/value heads, each shared by
// n_head / n_kv_head query heads; 1 = multi-query, Shazeer 2019) and no biases.
#pragma once

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "autograd/flash_attention.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "tensor/cuda/kernel_choice.h"

namespace loom::nn {

// LOOM_ATTENTION=reference in the environment: attend() runs the composition
// on the CPU too, and on a GPU even with LOOM_CUDA_KERNELS=fast (to compare
// the two: bench/gpt_step.sh's `attention` mode).
inline bool attention_reference_only() {
  static const bool reference = [] {
    const char* env = std::getenv("LOOM_ATTENTION");
    return env && std::string(env) == "reference";
  }();
  return reference;
}

// Every query against the keys it may see, then the values they weight:
// q, k, v [B, H, T, hd] -> [B, H, T, hd]. attn_dropout (may be null) drops
// attention weights while training. Shared by CausalSelfAttention and the
// tensor-parallel attention (each rank's heads).
inline Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, Dropout* attn_dropout) {
  using namespace loom::autograd;
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  // The fused op (tensor/ops_attention.cpp) does the same math and skips the
  // masked blocks of both products; it runs on CPU tensors in float32/float64
  // without attention dropout. Everywhere else (a GPU, bf16/fp16, dropout) the
  // composition below runs, which is also the fused op's reference
  // (tests/test_attention.cpp): the two agree to rounding.
  const bool dropout = attn_dropout && attn_dropout->p > 0.0 && attn_dropout->is_training();
  if (!dropout && !attention_reference_only() && q.device().is_cpu() &&
      (q.dtype() == kFloat32 || q.dtype() == kFloat64))
    return causal_attention(q, k, v, scale);
  // On a GPU with LOOM_CUDA_KERNELS=fast: flash attention (tensor/cuda/fast/),
  // no [T, T] matrix; attention dropout, float64, hd > 64 (bar 128 in bf16/fp16) stay here.
  if (!dropout && !attention_reference_only() && q.device().is_cuda() && cuda::fast_kernels() &&
      ops::flash_attention_unsupported(q, k, v).empty())
    return flash_attention(q, k, v, scale);
  // Every query against every key: [B, H, T, hd] @ [B, H, hd, T] -> [B, H, T, T].
  Tensor att = matmul(q, transpose(k, -2, -1));
  // Scale by 1/sqrt(hd), hide the future (token t sees keys 0..t only: the
  // others become -inf), softmax each row (it sums to 1 over the visible
  // keys). causal_softmax does the three in one pass; written out it is
  //   softmax(causal_mask_fill(att * scale, -inf)).
  att = causal_softmax(att, scale);
  if (attn_dropout) att = attn_dropout->forward(att);
  return matmul(att, v);  // [B, H, T, T] @ [B, H, T, hd] -> [B, H, T, hd]
}

// The attention core, q, k, v [B, H, T, hd] -> [B, H, T, hd] (attend() by
// default): the seam where context parallelism swaps in ring attention and
// selective recomputation wraps the core in a checkpoint.
using AttentionCore = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, Dropout* attn_dropout)>;

// k or v [B, n_kv_head, T, hd] -> [B, n_kv_head * n_rep, T, hd]: kv head j serves
// query heads [j n_rep, (j + 1) n_rep) (transformers' repeat_kv). Its backward
// sums the n_rep copies' gradients (expand's).
inline Tensor repeat_kv(const Tensor& x, int64_t n_rep) {
  using namespace loom::autograd;
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), hd = x.size(3);
  return reshape(expand(unsqueeze(x, 2), {B, Hkv, n_rep, T, hd}), {B, Hkv * n_rep, T, hd});
}

// Where the T tokens of each sequence a layer sees sit in the sequence, for
// RoPE: equal chunks of `length` tokens starting at `starts` ({}: one chunk
// from 0, positions 0..T-1, any T; a cp rank's zig-zag chunks: {r c, (2cp - 1 - r) c}
// of c tokens, parallel/context_parallel/zigzag.h).
struct RopeChunks {
  std::vector<int64_t> starts;
  int64_t length = 0;
};

// RoPE of q or k [B, H, T, hd] whose T tokens are the chunks. Errors if T is
// not theirs (as the learned positions check theirs: EmbeddingLayer::positions).
inline Tensor rope_chunks(const Tensor& x, double base, const RopeChunks& chunks) {
  using namespace loom::autograd;
  if (chunks.starts.empty()) return rope(x, base);
  const int64_t n = int64_t(chunks.starts.size());
  LOOM_CHECK(x.size(2) == n * chunks.length, "attention: ", x.size(2), " tokens of each sequence, but its RoPE "
             "positions are this cp rank's ", n, " chunks of ", chunks.length, " (", n * chunks.length, " tokens)");
  TensorList parts = split(x, chunks.length, 2);  // [B, H, length, hd] each
  for (size_t i = 0; i < parts.size(); ++i) parts[i] = rope(parts[i], base, chunks.starts[i]);
  return cat(parts, 2);
}

struct CausalSelfAttention : Layer {
  int64_t n_embd, n_head, n_kv_head;
  double rope_base;                // 0: no rotary embeddings (GPT-2's learned positions are added before)
  RopeChunks rope_pos0;            // RoPE: where T's equal chunks start ({}: 0; --cp: the zig-zag chunks)
  std::shared_ptr<Linear> c_attn;  // [(H + 2 Hkv) hd, C]: q, k and v projections stacked ([3C, C] for GPT-2)
  std::shared_ptr<Linear> c_proj;  // [C, C], a residual projection
  std::shared_ptr<Dropout> attn_dropout, resid_dropout;
  AttentionCore core = attend;

  // n_kv_head 0 means n_head (multi-head attention, GPT-2).
  CausalSelfAttention(int64_t C, int64_t n_head, Generator& gen, double proj_std, double p_dropout = 0.0,
                      int64_t n_kv_head = 0, bool bias = true, double rope_base = 0.0)
      : n_embd(C), n_head(n_head), n_kv_head(n_kv_head > 0 ? n_kv_head : n_head), rope_base(rope_base) {
    LOOM_CHECK(n_head > 0 && C % n_head == 0, "CausalSelfAttention: n_embd ", C, " is not divisible by n_head ",
               n_head);
    LOOM_CHECK(n_head % this->n_kv_head == 0, "CausalSelfAttention: n_head ", n_head,
               " is not divisible by n_kv_head ", this->n_kv_head);
    const int64_t kv = this->n_kv_head * (C / n_head);  // k and v widths
    c_attn = register_module("c_attn", std::make_shared<Linear>(C, C + 2 * kv, gen, 0.02, bias));
    c_proj = register_module("c_proj", std::make_shared<Linear>(C, C, gen, proj_std, bias));
    attn_dropout = register_module("attn_dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(p_dropout, gen.next_u64()));
  }

  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override {
    using namespace loom::autograd;
    LOOM_CHECK(x.dim() == 3 && x.size(2) == n_embd, "CausalSelfAttention: expected [B, T, ", n_embd, "], got ",
               x.shape());
    const int64_t B = x.size(0), T = x.size(1), C = n_embd, H = n_head, hd = C / H, Hkv = n_kv_head;

    Tensor qkv = c_attn->forward(x);  // [B, T, C + 2 Hkv hd]
    // q: [B, T, C], k, v: [B, T, Hkv hd] (views)
    TensorList parts = Hkv == H ? split(qkv, C, 2)
                                : TensorList{narrow(qkv, 2, 0, C), narrow(qkv, 2, C, Hkv * hd),
                                             narrow(qkv, 2, C + Hkv * hd, Hkv * hd)};
    auto heads = [&](const Tensor& t, int64_t h) {  // [B, T, h hd] -> [B, h, T, hd]
      return transpose(reshape(t, {B, T, h, hd}), 1, 2);
    };
    Tensor q = heads(parts[0], H), k = heads(parts[1], Hkv), v = heads(parts[2], Hkv);
    if (rope_base > 0) {  // rotate q and k by their positions: q·k then depends on the distance only
      q = rope_chunks(q, rope_base, rope_pos0);
      k = rope_chunks(k, rope_base, rope_pos0);
    }
    k = repeat_kv(k, H / Hkv);  // [B, H, T, hd]: each kv head serves H / Hkv query heads
    v = repeat_kv(v, H / Hkv);

    Tensor y = core(q, k, v, attn_dropout.get());  // [B, H, T, hd]
    y = reshape(transpose(y, 1, 2), {B, T, C});  // merge heads: [B, T, H, hd] -> [B, T, C]
    return resid_dropout->forward(c_proj->forward(y));
  }
};

}  // namespace loom::nn
