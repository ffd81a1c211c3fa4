// Dropout (inverted): in training, zero each element with probability p and
// scale the rest by 1/(1-p); in eval mode, or with p = 0 (the default), the
// identity. Each Dropout owns a counter-based generator (seed, offset)
// (tensor/kernels/philox.h): the seed is drawn from the model's seeded init
// generator, so a layer's mask does not depend on which other layers exist,
// and the offset counts its training calls. Masks are the same on CPU and GPU.
//
// A checkpoint needs only the offset: the seeds are drawn again from the
// config's seed when the model is rebuilt, and in train_gpt every Dropout runs
// once per micro-batch, so all share one offset (dropout_offset below).
#pragma once

#include <vector>

#include "autograd/functions.h"
#include "nn/module.h"
#include "tensor/generator.h"

namespace loom::nn {

struct Dropout : Layer {
  double p;
  PhiloxGenerator gen;

  explicit Dropout(double p = 0.0, uint64_t seed = 0) : p(p), gen{seed, 0} {
    LOOM_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
  }

  Tensor forward(const Tensor& x) override { return autograd::dropout(x, p, gen, is_training()); }
  // p = 0 draws nothing (autograd::dropout returns x), so its offset never moves: no random state to save
  // or replay (a --shared-experts MLP's dropout, p 0 beside the model's p > 0, would stay at 0 and make
  // dropout_offset refuse the checkpoint).
  PhiloxGenerator* generator() override { return p > 0 ? &gen : nullptr; }
};

// The generators of every Dropout in the tree under m (every module with a
// generator()), depth-first in registration order: the tree's random state.
inline void collect_generators(Module& m, std::vector<PhiloxGenerator*>& out) {
  if (PhiloxGenerator* g = m.generator()) out.push_back(g);
  for (const auto& [name, child] : m.named_children()) collect_generators(*child, out);
}
inline std::vector<PhiloxGenerator*> dropout_generators(Module& m) {
  std::vector<PhiloxGenerator*> out;
  collect_generators(m, out);
  return out;
}

// The offset every Dropout under m has reached (0 when there is none). They
// must agree: a model whose layers ran different numbers of training calls
// cannot be saved as one offset.
inline uint64_t dropout_offset(Module& m) {
  const std::vector<PhiloxGenerator*> gens = dropout_generators(m);
  if (gens.empty()) return 0;
  for (const PhiloxGenerator* g : gens)
    LOOM_CHECK(g->offset == gens.front()->offset, "dropout_offset: the model's Dropout layers ran ",
               gens.front()->offset, " and ", g->offset, " training calls; a checkpoint holds one offset");
  return gens.front()->offset;
}

// Puts every Dropout under m at `offset` (a resume: the next call draws what the saved run would have drawn).
inline void set_dropout_offset(Module& m, uint64_t offset) {
  for (PhiloxGenerator* g : dropout_generators(m)) g->offset = offset;
}

}  // namespace loom::nn
