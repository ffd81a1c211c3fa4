// Dropout (inverted): in training, zero each element with probability p and
// scale the rest by 1/(1-p); in eval mode, or with p = 0 (the default), the
// identity. Each Dropout owns a seeded Generator, so a run is reproducible and
// a layer's mask does not depend on which other layers exist.
#pragma once

#include "autograd/functions.h"
#include "nn/module.h"
#include "tensor/generator.h"

namespace loom::nn {

struct Dropout : Layer {
  double p;
  Generator gen;

  explicit Dropout(double p = 0.0, uint64_t seed = 0) : p(p), gen(seed) {
    LOOM_CHECK(p >= 0.0 && p < 1.0, "Dropout: p must be in [0, 1), got ", p);
  }

  Tensor forward(const Tensor& x) override { return autograd::dropout(x, p, gen, is_training()); }
};

}  // namespace loom::nn
