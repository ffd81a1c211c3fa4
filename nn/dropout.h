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
};

// Every Dropout in the tree under m, depth-first in registration order.
inline void collect_dropouts(Module& m, std::vector<Dropout*>& out) {
  if (auto* d = dynamic_cast<Dropout*>(&m)) out.push_back(d);
  for (const auto& [name, child] : m.named_children()) collect_dropouts(*child, out);
}

// The offset every Dropout under m has reached (0 when there is none). They
// must agree: a model whose layers ran different numbers of training calls
// cannot be saved as one offset.
inline uint64_t dropout_offset(Module& m) {
  std::vector<Dropout*> ds;
  collect_dropouts(m, ds);
  if (ds.empty()) return 0;
  for (const Dropout* d : ds)
    LOOM_CHECK(d->gen.offset == ds.front()->gen.offset, "dropout_offset: the model's Dropout layers ran ",
               ds.front()->gen.offset, " and ", d->gen.offset, " training calls; a checkpoint holds one offset");
  return ds.front()->gen.offset;
}

// Puts every Dropout under m at `offset` (a resume: the next call draws what the saved run would have drawn).
inline void set_dropout_offset(Module& m, uint64_t offset) {
  std::vector<Dropout*> ds;
  collect_dropouts(m, ds);
  for (Dropout* d : ds) d->gen.offset = offset;
}

}  // namespace loom::nn
