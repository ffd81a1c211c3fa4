// The parts of activation_memory.cpp's count, one function each: the sizes
// every part reads (Sizes), and the backward's peak above what is kept at
// each of the moments (A) to (F) of activation_memory.h (Moments), with the
// .grad tensors alive at each. predict_activations takes the largest.
#pragma once

#include "optim/activation_memory.h"
#include "optim/moe_activations.h"

namespace loom::optim {

// The sizes every moment below reads: the case's numbers as doubles, and the
// bytes of the tensors the moments count.
struct Sizes {
  double b, s, h, a, t, V, e;
  bool native;      // bf16 GEMMs without fp32 copies
  double F;         // the MLP's width
  double N;         // tokens per micro-batch
  double Ns;        // of them in this rank's replicated regions
  double unit;      // one [b, s, h] tensor
  double local;     // one replicated [b, s, h] (sharded under SP)
  double stats;     // a norm's rows' 1/rms, or mean and 1/std, fp32
  double mlp_kept;  // per token: gate, silu, up, product; or fc, gelu (split over tp)
  double mlp_bytes; // what one block's MLP keeps: N mlp_kept / t x e; a MoE block's own count
                    // (moe_activations.h: its router and experts are whole on every tp rank, not / t),
                    // the last block's (with a capacity its rows are the routing's, block by block)
  double mlp_mean;  // the blocks' mean of it (what all of them keep)
  double gathers;   // ln_2's output as the MLP keeps it (units): under SP gathered, SwiGLU's two column
                    // linears a copy each; a MoE block routes the tokens this rank holds (SP: 1 / t)
  double block_kept = 0;   // every activation of one block
  double scores_kept = 0;  // the softmax one block keeps
  double logits = 0;       // the fp32 logits the loss keeps [N, V'/t]
  double head = 0;         // what the head keeps (0 on a stage without it)
  double wte_grad = 0;     // the head's wte gradient, waiting for the embedding's

  explicit Sizes(const ActivationCase& c)
      : b(double(c.micro_batch)), s(double(c.seq)), h(double(c.width)), a(double(c.heads)), t(double(c.tp)),
        V(double(c.vocab)), e(double(c.element_bytes)), native(c.native_bf16_gemm && c.element_bytes == 2),
        F(c.mlp_hidden > 0 ? double(c.mlp_hidden) : 4 * h), N(b * s), Ns(c.sequence_parallel ? N / t : N),
        unit(N * h * e), local(Ns * h * e), stats(c.rmsnorm ? Ns * 4 : 2 * Ns * 4),
        mlp_kept(c.swiglu ? 4 * F : 2 * F), mlp_bytes(c.moe_experts > 0 ? moe_kept_bytes(c, true) : N * mlp_kept / t * e),
        mlp_mean(c.moe_experts > 0 ? moe_kept_bytes(c) : mlp_bytes),
        gathers(c.moe_experts > 0 ? Ns / N : c.sequence_parallel && c.swiglu ? 2 : 1) {}
};

// The backward's peak above what is kept, at each of the moments (A) to (F)
// of the header: the largest counts.
struct Moments {
  double head = 0, ln_f = 0, block = 0, gate = 0, attention = 0, ln_2 = 0, rerun_collective = 0;
  double moe_rerun = 0;  // (U) again, in full recomputation's rerun of the last MoE block (moe_activations.h)
  double forward = 0;    // (U) the last MoE block's forward (ZeRO-3's units then; its own bytes: moe_forward_bytes)
  double unit_reduce = 0;  // (R) ZeRO-3: the last block's unit flattened for its reduce-scatter (zero3_activations.h)
};

// Each moment's bytes above what is kept (Sizes::block_kept and the head's
// tensors set by the count of what is kept, activation_memory.cpp).
Moments backward_moments(const ActivationCase& c, const Sizes& z);
// The .grad tensors alive at each moment, without a main_grad buffer.
Moments grads_at(const ActivationCase& c, const Sizes& z);
// Under ZeRO-3 in their place: the gathered units, the unit's .grad tensors and the reduce-scatter in
// flight at each moment m (optim/zero3_activations.h).
Moments zero3_at(const ActivationCase& c, const Sizes& z, const Moments& m);
// (A) once the loss's backward is done, in the head layer's own: the head linear's backward.
double at_head_linear(const ActivationCase& c, const Sizes& z);

// One Linear's backward temporaries for x [M, K], w [n, K] (the incoming
// gradient [M, n] counted by the caller): fp32 or native bf16 dx and dW;
// other 16-bit on fp32 copies (activation_moments.cpp says which).
double linear_backward_temporaries(double M, double K, double n, double e, bool bias, bool native);
// The temporaries of a norm's backward (tensor/ops_nn.cpp, ops_llama.cpp)
// over R rows of width h. fp32: dx [R, h], dweight (and dbias) [h]. 16-bit:
// fp32 copies of the gradient, x and the weight, dx, dweight (and dbias) in
// fp32 and each rounded, all alive when it returns. RMSNorm has no bias.
double norm_backward_temporaries(double R, double h, double e, bool rmsnorm);
// What one block keeps until its backward (the last block's, without recomputation; selective: less the
// softmax).
double block_kept_now(const ActivationCase& c, const Sizes& z);

// Its dx alone (a split backward's B; W makes dW): fp32 or native bf16 dx [M, K]; other 16-bit the
// gradient's fp32 copy [M, n] and dx in fp32 and rounded.
double linear_dx_temporaries(double M, double K, double n, double e, bool native);

// One block's attention: the k and v width, whether repeat_kv copies, and q,
// k, v's kept elements per token (before / t).
double kv_width(const ActivationCase& c);
bool repeat_kv_copies(const ActivationCase& c);
double attention_qkv_elements(const ActivationCase& c);

}  // namespace loom::optim
