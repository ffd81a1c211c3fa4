#include "parallel/recompute.h"

#include "autograd/checkpoint.h"
#include "parallel/teach/teach_break.h"
#include "tensor/grad_mode.h"

namespace loom::parallel {

namespace {

// --teach-break recompute-fresh-dropout: the rerun (the run with grad on; the
// first is under the checkpoint's NoGradGuard) draws the next call's masks
// instead of the forward's, so backward differentiates a network the forward never ran.
void teach_fresh_masks(const std::vector<PhiloxGenerator*>& rng) {
  if (teach::broken(teach::Break::RecomputeFreshDropout) && GradMode::is_enabled())
    for (PhiloxGenerator* g : rng) ++g->offset;
}

// A block that keeps only its input: forward under a checkpoint. Its children
// are the block's own (ln_1, attn, ...), so the parameters keep their names.
// A mixture-of-experts block (nn/moe.h) is rerun whole, routing included: the
// gate's weights move only in the optimizer step and DeepSeek's bias just
// after it, both after backward, so the rerun picks the same experts and, at
// a capacity, drops the same slots; only the rerun (grad on) counts the
// routing for the log and the bias. Under --ep the rerun runs the dispatch and
// combine all-to-alls again, as Megatron's full recompute does, rather than
// keeping the dispatched rows [R, C]: those rows and the experts' activations
// on them are what the checkpoint is there to free, and every ep rank reruns
// its blocks in the same backward order, so the all-to-alls pair up. Cost: two
// more all-to-alls per block and micro-batch (tests/test_train_gpt_moe_pipeline.cpp).
struct CheckpointedBlock : nn::Layer {
  std::shared_ptr<nn::Layer> block;
  std::vector<PhiloxGenerator*> rng;

  explicit CheckpointedBlock(std::shared_ptr<nn::Layer> b) : block(std::move(b)), rng(nn::dropout_generators(*block)) {
    for (const auto& [name, child] : block->named_children()) register_module(name, child);
  }
  // x: [B, T, C] -> [B, T, C]
  Tensor forward(const Tensor& x) override {
    auto run = [this](const autograd::TensorList& in) {
      teach_fresh_masks(rng);
      return autograd::TensorList{block->forward(in[0])};
    };
    return autograd::checkpoint(run, {x}, rng)[0];
  }
  void train(bool on = true) override {
    Layer::train(on);
    block->train(on);
  }
};

// The attention core under a checkpoint: q, k, v [B, H, T, hd] kept, the
// scores and the softmax [B, H, T, T] rebuilt in backward.
nn::AttentionCore checkpointed(nn::AttentionCore core) {
  return [core](const Tensor& q, const Tensor& k, const Tensor& v, nn::Dropout* attn_dropout) {
    std::vector<PhiloxGenerator*> rng;
    if (attn_dropout) rng = nn::dropout_generators(*attn_dropout);
    auto run = [core, rng, attn_dropout](const autograd::TensorList& in) {
      teach_fresh_masks(rng);
      return autograd::TensorList{core(in[0], in[1], in[2], attn_dropout)};
    };
    return autograd::checkpoint(run, {q, k, v}, rng)[0];
  };
}

}  // namespace

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw Error(str("--recompute '", name, "': expected none, selective (the attention core) or full (each block)"));
}

LayerBuilder with_recompute(LayerBuilder b, const nn::GPTConfig& cfg, Recompute mode) {
  if (mode == Recompute::None) return b;
  auto build = b.build ? b.build : [cfg](int64_t begin, int64_t end) { return nn::build_gpt_layers(cfg, begin, end); };
  b.build = [build, cfg, mode](int64_t begin, int64_t end) {
    std::vector<std::shared_ptr<nn::Layer>> layers = build(begin, end);
    for (int64_t i = begin; i < end; ++i) {
      if (i == 0 || i == cfg.num_layers() - 1) continue;  // the embedding and the head are not blocks
      std::shared_ptr<nn::Layer>& layer = layers[size_t(i - begin)];
      if (mode == Recompute::Full) {
        layer = std::make_shared<CheckpointedBlock>(layer);
      } else {  // layers 1 .. L are blocks (nn::BlockLayer), whoever cut them
        nn::AttentionCore& core = static_cast<nn::BlockLayer&>(*layer).attention_core();
        core = checkpointed(core);
      }
    }
    return layers;
  };
  return b;
}

}  // namespace loom::parallel
