// What loom_plan is asked about: a GPT's shape, the batch, the parallel grid
// and the precision - the same knobs as train_gpt's flags (--layers, --embd,
// --heads, --block, --batch, --microbatches, --dp, --pp, --tp, --zero,
// --dtype, --sequence-parallel, --cp), plus two that train_gpt does not have yet
// (virtual stages and activation recomputation) so that published runs
// (Megatron-LM's) can be described.
#pragma once

#include <cstdint>
#include <string>

namespace loom::plan {

struct ModelShape {
  int64_t layers = 4;    // L: transformer blocks
  int64_t width = 128;   // h (C in loom's code): the residual stream
  int64_t heads = 4;     // a
  int64_t vocab = 65;    // V (padded to a multiple of tp, as loom's vocab-parallel embedding does)
  int64_t seq = 64;      // s: tokens per sequence (block size)
  // Llama's blocks (train_gpt --arch llama): RMSNorm, RoPE (no wpe), SwiGLU's
  // three matrices, grouped-query attention's smaller k and v, an untied head, no biases.
  bool llama = false;
  int64_t kv_heads = 0;  // key/value heads (0: heads)
  int64_t ffn = 0;       // the MLP width (0: 4h, or llama's 8h/3 rounded up to 8)

  // A mixture of experts in the MLP's place (train_gpt --experts, nn/moe.h; Llama's blocks):
  // a router [E, h], E SwiGLU experts of width I, each token through k of them,
  // and S shared experts every token passes (one SwiGLU of width S I). plan/moe_model.h.
  int64_t experts = 0;            // E (0: every block dense)
  int64_t experts_per_token = 2;  // k
  int64_t shared_experts = 0;     // S
  int64_t expert_ffn = 0;         // I (0: ffn_width())
  int64_t dense_layers = 0;       // the first blocks keep the dense MLP of width F (DeepSeek-V3's first 3)
  double capacity_factor = 0;     // F: each expert computes at most ceil(F N k / E) rows (0: dropless)
  int64_t attn_params = 0;        // one block's attention weights, when not q, k, v, o of heads and kv heads
                                  // (DeepSeek-V3's low-rank MLA: its published count); 0: from the heads

  int64_t kv_width() const { return (kv_heads > 0 ? kv_heads : heads) * (width / heads); }
  int64_t ffn_width() const { return ffn > 0 ? ffn : llama ? (8 * width / 3 + 7) / 8 * 8 : 4 * width; }
  int64_t attention_matmul_params() const {
    return attn_params > 0 ? attn_params : 2 * width * width + 2 * width * kv_width();
  }
  // One dense block's matmul weights: q and the output h², k and v 2 h kv, the MLP 2 or 3 h F (12 h² for GPT-2).
  int64_t block_matmul_params() const { return attention_matmul_params() + (llama ? 3 : 2) * width * ffn_width(); }
};

struct Grid {
  int dp = 1, pp = 1, tp = 1;
  int cp = 1;                   // context parallel: each sequence's tokens split over cp ranks, attention a ring
  int ep = 1;                   // expert parallel: the experts split over ep of the dp ranks (Megatron's
                                // expert-model-parallel, carved out of dp: ep divides dp); each expert
                                // replicated over dp / ep ranks, its expert-dp group (plan/moe_model.h)
  int virtual_stages = 1;       // v: model chunks per pipeline rank (interleaved 1F1B); 1 = plain 1F1B
  int zero = 0;                 // ZeRO stage: 1 optimizer state sharded over dp, 2 the gradients too, 3 the params too
  int dp_shard = 0;             // --zero 3 with HSDP: sharded over groups of dp_shard dp ranks, replicated dp / dp_shard times (0: dp)
  bool sequence_parallel = false;
  bool recompute = false;       // full activation recomputation (Megatron --recompute-granularity full)
  bool recompute_selective = false;  // only the attention core (--recompute-granularity selective)
  std::string dtype = "fp32";   // fp32 | bf16 | fp16: params and activations
  std::string schedule = "1f1b";  // 1f1b | afab | zb-h1 | zb-v | dualpipev: activations a stage holds; zb-*: the bubble too
  // How layers are cut into stages: "uniform" and "balanced" are train_gpt's
  // --partition over [embedding, blocks, head]; "blocks" is Megatron-LM's:
  // the blocks evenly, the embedding joining the first stage, the head the last.
  std::string partition = "uniform";
  int world() const { return dp * pp * tp * cp; }
  int shard_ranks() const { return (dp_shard ? dp_shard : dp) * cp; }  // ZeRO-3's shard group (dp x cp without HSDP)
  int replicas() const { return dp / (dp_shard ? dp_shard : dp); }    // HSDP: copies of each shard  // rank order: tp fastest, then cp, dp, pp (train_gpt's grid)
};

struct Batch {
  int64_t micro_batch = 16;  // b: sequences per micro-batch per dp rank (train_gpt --batch)
  int64_t micro_batches = 1; // m: per step (train_gpt --microbatches, or --grad-accum without pp)
  int64_t tokens_per_step(const ModelShape& s, const Grid& g) const { return int64_t(g.dp) * micro_batch * micro_batches * s.seq; }
};

// Bytes of one element of the model's dtype (params and activations).
int dtype_bytes(const std::string& dtype);

}  // namespace loom::plan
