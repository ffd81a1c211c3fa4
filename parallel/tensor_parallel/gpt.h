// The GPT's layer list split over the tp group, cut from the full layers
// (nn/gpt.h) so that tp = N starts from tp = 1's weights:
//   layer 0      TensorParallelEmbedding  wte vocab-parallel, wpe replicated
//   layer 1..L   TensorParallelBlock      (block.h)
//   layer L + 1  TensorParallelHead       ln_f replicated; logits against this rank's
//                                         wte rows only: [B, T, V_pad / tp], never all V
// and the loss is vocab_parallel_cross_entropy over those logits. An untied
// head (Llama's lm_head) is split by vocabulary rows the same way. The tied
// embedding stays tied: a stage holding layer 0 and L + 1 shares one
// VocabParallelEmbedding weight between them.
//
// Vocabulary padding (Megatron's make_vocab_size_divisible_by): V is padded up
// to a multiple of tp with zero rows no id looks up; the loss leaves their
// logits out, so the padded model computes exactly the unpadded one.
// Sequence parallelism: the embedding's output is scattered along T, the
// blocks run on [B, T/tp, C], and the head gathers T back before its logits.
#pragma once

#include <memory>
#include <vector>

#include "nn/gpt.h"
#include "parallel/tensor_parallel/block.h"
#include "parallel/tensor_parallel/layers.h"

namespace loom::parallel {

// V rounded up to a multiple of tp.
int64_t padded_vocab_size(int64_t vocab_size, int tp_size);

struct TensorParallelEmbedding : nn::EmbeddingLayer {
  std::shared_ptr<VocabParallelEmbedding> wte;  // [V_pad / tp, C]
  std::shared_ptr<nn::Embedding> wpe;           // [block_size, C], replicated; null with RoPE
  bool sequence_parallel;
  ProcessGroup& tp;

  TensorParallelEmbedding(const nn::GPTEmbedding& full, int64_t vocab_size, ProcessGroup& tp, bool sequence_parallel);
  // idx [B, T] -> [B, T, C] ([B, T/tp, C] under sequence parallelism)
  Tensor forward(const Tensor& idx) override;
  Tensor token_embedding() const override { return wte->weight; }
};

struct TensorParallelHead : nn::HeadLayer {
  std::shared_ptr<nn::LayerNorm> ln_f;          // replicated
  std::shared_ptr<VocabParallelEmbedding> wte;  // tied to the embedding's, or this stage's copy, or lm_head's rows
  bool tied = true;                             // false: wte is the untied lm_head (registered as "lm_head")
  int64_t vocab_size;                           // V, before padding
  bool sequence_parallel;
  ProcessGroup& tp;

  TensorParallelHead(const nn::GPTHead& full, std::shared_ptr<VocabParallelEmbedding> tied_wte, int64_t vocab_size,
                     ProcessGroup& tp, bool sequence_parallel);
  // x [B, T, C] ([B, T/tp, C]) -> this rank's logits [B, T, V_pad / tp]
  Tensor forward(const Tensor& x) override;
  Tensor token_embedding() const override { return tied ? wte->weight : Tensor(); }
  void tie_to(const nn::EmbeddingLayer& embedding) override;  // embedding: a TensorParallelEmbedding
  // The mean cross-entropy over the true vocabulary, vocab-parallel over
  // logits [B, T, V_pad/tp]: nn's cross_entropy_loss of the full logits.
  Tensor loss(const Tensor& logits, const Tensor& targets) const override;
};

// What tensor parallelism cuts, so what tp must divide: the query heads, the
// key/value heads (each rank keeps those its query heads read), the MLP width
// and, under sequence parallelism, the sequence. The vocabulary is padded
// instead (vocab_padded_size). The one place these rules live: the model
// builder, train_gpt's flag checks and loom_plan's call it; errors name
// train_gpt's flags and both numbers.
struct TensorParallelSizes {
  int64_t heads, kv_heads, ffn_hidden, block;
};
void check_tensor_parallel_split(const TensorParallelSizes& sizes, int tp, bool sequence_parallel);
inline void check_tensor_parallel_split(const nn::GPTConfig& cfg, int tp, bool sequence_parallel) {
  check_tensor_parallel_split(TensorParallelSizes{cfg.n_head, cfg.kv_heads(), cfg.ffn_hidden(), cfg.block_size}, tp,
                              sequence_parallel);
}

// Layers [begin, end) of the GPT of cfg, split over tp. dropout must be 0.
std::vector<std::shared_ptr<nn::Layer>> build_tensor_parallel_gpt_layers(const nn::GPTConfig& cfg, int64_t begin,
                                                                         int64_t end, ProcessGroup& tp,
                                                                         bool sequence_parallel = false);

// The same from full layers already built (nn::build_gpt_layers(cfg, begin,
// ...)): each cut to this rank's shards. shard_map.h cuts layers whose
// weights hold their own element indices, to learn where each shard came from.
std::vector<std::shared_ptr<nn::Layer>> cut_gpt_layers_for_tp(const std::vector<std::shared_ptr<nn::Layer>>& full,
                                                              const nn::GPTConfig& cfg, int64_t begin,
                                                              ProcessGroup& tp, bool sequence_parallel = false);

}  // namespace loom::parallel
