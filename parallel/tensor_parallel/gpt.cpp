#include "parallel/tensor_parallel/gpt.h"

#include "autograd/functions.h"
#include "parallel/tensor_parallel/cross_entropy.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// The full table [V, C] with zero rows appended up to V_pad.
Tensor padded_table(const Tensor& w, int64_t padded) {
  if (w.size(0) == padded) return w;
  Tensor out = zeros({padded, w.size(1)}, w.dtype());
  ops::copy_(ops::narrow(out, 0, 0, w.size(0)), w);
  return out;
}

}  // namespace

int64_t padded_vocab_size(int64_t vocab_size, int tp_size) { return (vocab_size + tp_size - 1) / tp_size * tp_size; }

TensorParallelEmbedding::TensorParallelEmbedding(const nn::GPTEmbedding& full, int64_t vocab_size, ProcessGroup& tp_,
                                                 bool sp)
    : sequence_parallel(sp), tp(tp_) {
  LOOM_CHECK(full.drop->p == 0, "tensor parallel GPT: dropout is not supported with tp > 1 yet");
  wte = register_module("wte", std::make_shared<VocabParallelEmbedding>(
                                   padded_table(full.wte->weight, padded_vocab_size(vocab_size, tp.size())), tp));
  if (!full.wpe) return;  // RoPE (Llama): no learned positions
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(full.wpe->weight.size(0), full.wpe->weight.size(1),
                                                                *std::make_unique<Generator>(0)));
  NoGradGuard no_grad;
  ops::copy_(wpe->weight, full.wpe->weight);
}

Tensor TensorParallelEmbedding::forward(const Tensor& idx) {
  const int64_t T = idx.size(1);
  Tensor x = wte->forward(idx);  // [B, T, C], whole on every rank
  if (wpe) x = autograd::add(x, wpe->forward(positions(T)));
  return sequence_parallel ? scatter_to_sp_region(x, tp) : x;
}

TensorParallelHead::TensorParallelHead(const nn::GPTHead& full, std::shared_ptr<VocabParallelEmbedding> tied_wte,
                                       int64_t vocab_size_, ProcessGroup& tp_, bool sp)
    : vocab_size(vocab_size_), sequence_parallel(sp), tp(tp_) {
  ln_f = register_module("ln_f", full.ln_f->copy());
  // Tied: the embedding's wte (or this stage's copy); untied (Llama): lm_head's
  // rows split by vocabulary the same way, under its own name.
  wte = register_module(full.lm_head ? "lm_head" : "wte", std::move(tied_wte));
  tied = !full.lm_head;
}

void TensorParallelHead::tie_to(const nn::EmbeddingLayer& embedding) {
  LOOM_CHECK(tied, "TensorParallelHead::tie_to: an untied head (lm_head) has no embedding to share");
  wte = static_cast<const TensorParallelEmbedding&>(embedding).wte;
  replace_module("wte", wte);
}

Tensor TensorParallelHead::forward(const Tensor& x) {
  Tensor h = ln_f->forward(x);
  // f: all of h against this rank's rows of wte (under SP, gather T first).
  h = sequence_parallel ? gather_from_sp_region(h, tp) : copy_to_tp_region(h, tp);
  return autograd::linear(h, wte->weight, Tensor());  // [B, T, C] @ [C, V_pad/tp]
}

Tensor TensorParallelHead::loss(const Tensor& logits, const Tensor& targets) const {
  const int64_t v = logits.size(-1);
  return vocab_parallel_cross_entropy(autograd::reshape(logits, {-1, v}), ops::reshape(targets, {-1}),
                                      wte->vocab_start, tp, -100, vocab_size);
}

void check_tensor_parallel_split(const TensorParallelSizes& s, int tp, bool sp) {
  LOOM_CHECK(s.heads % tp == 0, "--tp ", tp, " must divide --heads ", s.heads, " (attention is split by heads)");
  LOOM_CHECK(s.kv_heads % tp == 0, "--tp ", tp, " must divide the key/value heads (--kv-heads ", s.kv_heads,
             "): each rank keeps the kv heads its query heads read");
  LOOM_CHECK(s.ffn_hidden % tp == 0, "--tp ", tp, " must divide the MLP width ", s.ffn_hidden,
             " (--mlp-hidden, or its default from --embd)");
  LOOM_CHECK(!sp || s.block % tp == 0, "--sequence-parallel: --tp ", tp, " must divide --block ", s.block,
             " (each rank holds block / tp positions)");
}

std::vector<std::shared_ptr<nn::Layer>> build_tensor_parallel_gpt_layers(const nn::GPTConfig& cfg, int64_t begin,
                                                                         int64_t end, ProcessGroup& tp, bool sp) {
  // The full layers first (each from its own generator, nn/gpt.h), then each cut to this rank's shards.
  return cut_gpt_layers_for_tp(nn::build_gpt_layers(cfg, begin, end), cfg, begin, tp, sp);
}

std::vector<std::shared_ptr<nn::Layer>> cut_gpt_layers_for_tp(const std::vector<std::shared_ptr<nn::Layer>>& full,
                                                              const nn::GPTConfig& cfg, int64_t begin,
                                                              ProcessGroup& tp, bool sp) {
  check_tensor_parallel_split(cfg, tp.size(), sp);
  std::vector<std::shared_ptr<nn::Layer>> out;
  std::shared_ptr<VocabParallelEmbedding> embedding_wte;
  for (size_t k = 0; k < full.size(); ++k) {
    const int64_t i = begin + int64_t(k);
    if (i == 0) {
      auto e = std::make_shared<TensorParallelEmbedding>(static_cast<nn::GPTEmbedding&>(*full[k]), cfg.vocab_size,
                                                         tp, sp);
      embedding_wte = e->wte;
      out.push_back(e);
    } else if (i == cfg.num_layers() - 1) {
      auto& head = static_cast<nn::GPTHead&>(*full[k]);
      const Tensor& table = head.lm_head ? head.lm_head->weight : head.wte->weight;  // [V, C] either way
      auto wte = embedding_wte && !head.lm_head
                     ? embedding_wte
                     : std::make_shared<VocabParallelEmbedding>(
                           padded_table(table, padded_vocab_size(cfg.vocab_size, tp.size())), tp);
      out.push_back(std::make_shared<TensorParallelHead>(head, wte, cfg.vocab_size, tp, sp));
    } else {
      out.push_back(std::make_shared<TensorParallelBlock>(static_cast<nn::Block&>(*full[k]), tp, sp));
    }
  }
  return out;
}

}  // namespace loom::parallel
