// A pipeline stage whose work takes a fixed time without using a core: every
// micro-batch's forward through the stage also sleeps F and its backward 2F
// (a backward costs about two forwards): F for the input's gradient and F for
// a stand-in weight's, so a zero-bubble schedule splits it into a B and a W of
// F each, as the paper's T_F = T_B = T_W (zero_bubble_schedule.h). With a tiny model the stages then
// take equal, fixed times without competing for cores - the theory's premise,
// one device per stage - so a bench measures the schedule's own bubble and
// transfers, even with more stages than cores. Shared by
// bench_pipeline_memory and bench_pipeline_grad_sync.
//
// The sleeping is in the layers (a LayerBuilder for parallel::ModelChunks):
// each of the stage's n layers sleeps F / n, so a chunk of k layers sleeps
// k F / n (F / v for v equal chunks). The model type itself stays as it is.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "autograd/function.h"
#include "autograd/variable.h"
#include "parallel/model_chunks.h"
#include "tensor/ops.h"

namespace loom::bench {

// The identity, but its forward sleeps f and its backward 2f: f for x's
// gradient (B) and f for w's (W; w: a scalar leaf that requires grad).
inline Tensor simulated_compute(const Tensor& x, const Tensor& w, std::chrono::microseconds f) {
  std::this_thread::sleep_for(f);
  return autograd::record_split(
      "SimulatedCompute", {&x}, {&w}, ops::view(x, x.shape()),
      [f](const autograd::TensorList& g) {
        std::this_thread::sleep_for(f);
        return autograd::TensorList{g[0]};
      },
      [f, w](const autograd::TensorList&) {
        std::this_thread::sleep_for(f);
        return autograd::TensorList{zeros(w.shape(), w.dtype())};
      });
}

// A layer, then the sleep. Base: nn::Layer, or the embedding's and the head's
// interfaces (nn::EmbeddingLayer, nn::HeadLayer), which the model asks for
// the tied weight and the loss. The inner layer's children are this layer's,
// under the same names, so the model's parameter names do not change.
template <class Base>
struct Sleeping : Base {
  Sleeping(std::shared_ptr<nn::Layer> inner, std::chrono::microseconds f) : inner_(std::move(inner)), f_(f) {
    for (const auto& [name, m] : inner_->named_children()) this->register_module(name, m);
  }
  Tensor forward(const Tensor& x) override { return simulated_compute(inner_->forward(x), w_, f_); }
  const nn::Layer& inner() const { return *inner_; }

 protected:
  std::shared_ptr<nn::Layer> inner_;
  std::chrono::microseconds f_;
  Tensor w_ = autograd::set_requires_grad(zeros({}));  // not a parameter: only its W's sleep matters
};
struct SleepingEmbedding : Sleeping<nn::EmbeddingLayer> {
  using Sleeping::Sleeping;
  Tensor token_embedding() const override { return static_cast<nn::EmbeddingLayer&>(*inner_).token_embedding(); }
};
struct SleepingHead : Sleeping<nn::HeadLayer> {
  using Sleeping::Sleeping;
  Tensor token_embedding() const override { return static_cast<nn::HeadLayer&>(*inner_).token_embedding(); }
  // Both ends on one stage (a V): the inner head takes the inner embedding's wte, and so does this layer.
  void tie_to(const nn::EmbeddingLayer& embedding) override {
    const auto& inner_embedding = static_cast<const nn::EmbeddingLayer&>(static_cast<const SleepingEmbedding&>(embedding).inner());
    static_cast<nn::HeadLayer&>(*inner_).tie_to(inner_embedding);
    for (const auto& [name, m] : inner_->named_children())
      if (name == "wte") this->replace_module(name, m);
  }
  Tensor loss(const Tensor& logits, const Tensor& targets) const override {
    return static_cast<nn::HeadLayer&>(*inner_).loss(logits, targets);
  }
};

// The stage of `chunks` of cfg's GPT, each layer sleeping f / (the stage's layer count).
inline std::unique_ptr<parallel::ModelChunks> simulated_stage(const nn::GPTConfig& cfg,
                                                              std::vector<parallel::LayerRange> chunks,
                                                              std::chrono::microseconds f) {
  int64_t n = 0;
  for (const parallel::LayerRange& r : chunks) n += r.size();
  const std::chrono::microseconds per_layer = f / n;
  parallel::LayerBuilder b;
  b.build = [&cfg, per_layer](int64_t begin, int64_t end) {
    std::vector<std::shared_ptr<nn::Layer>> out;
    for (int64_t i = begin; auto& layer : nn::build_gpt_layers(cfg, begin, end)) {
      if (i == 0) out.push_back(std::make_shared<SleepingEmbedding>(layer, per_layer));
      else if (i == cfg.num_layers() - 1) out.push_back(std::make_shared<SleepingHead>(layer, per_layer));
      else out.push_back(std::make_shared<Sleeping<nn::Layer>>(layer, per_layer));
      ++i;
    }
    return out;
  };
  return std::make_unique<parallel::ModelChunks>(cfg, std::move(chunks), b);
}

}  // namespace loom::bench
