// Embedding: a lookup table, row idx of weight for every id. weight: [num, dim]
// ~ N(0, std) (GPT-2). Its gradient sums the rows of repeated ids.
#pragma once

#include "autograd/functions.h"
#include "nn/module.h"
#include "tensor/generator.h"

namespace loom::nn {

struct Embedding : Layer {
  Tensor weight;  // [num_embeddings, embedding_dim]

  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen, double init_std = 0.02) {
    weight = register_parameter("weight", randn({num_embeddings, embedding_dim}, gen, kFloat32, 0.0, init_std));
  }

  // idx: int32/int64 of any shape [...] -> [..., dim]
  Tensor forward(const Tensor& idx) override { return autograd::embedding(weight, idx); }
};

}  // namespace loom::nn
