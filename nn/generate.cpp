#include "nn/generate.h"

#include <algorithm>
#include <cmath>

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::nn {

std::vector<int32_t> generate(GPT& model, std::vector<int32_t> ids, const SampleOptions& opts) {
  LOOM_CHECK(!ids.empty(), "generate: the prompt is empty");
  LOOM_CHECK(opts.temperature > 0, "generate: temperature must be > 0, got ", opts.temperature);
  NoGradGuard no_grad;
  bool was_training = model.is_training();
  model.eval();
  Generator gen(opts.seed);
  const int64_t T = model.config().block_size, V = model.config().vocab_size;
  const Device device = model.parameters().front().device();  // the context goes where the model is
  for (int64_t n = 0; n < opts.num_tokens; ++n) {
    int64_t len = std::min<int64_t>(int64_t(ids.size()), T);
    std::vector<int64_t> ctx(ids.end() - len, ids.end());
    Tensor logits = model.forward(ops::to(from_vector(ctx, {1, len}), device));  // [1, len, V]
    std::vector<double> row = ops::narrow(ops::reshape(logits, {len, V}), 0, len - 1, 1).to_vector<double>();
    for (double& x : row) x /= opts.temperature;
    if (opts.top_k > 0 && opts.top_k < V) {
      std::vector<double> sorted = row;
      std::nth_element(sorted.begin(), sorted.begin() + (opts.top_k - 1), sorted.end(), std::greater<double>());
      double kth = sorted[size_t(opts.top_k - 1)];
      for (double& x : row) if (x < kth) x = -INFINITY;
    }
    double m = *std::max_element(row.begin(), row.end()), total = 0;
    for (double& x : row) { x = std::exp(x - m); total += x; }
    double u = gen.uniform() * total, acc = 0;
    int32_t next = int32_t(V - 1);
    for (int64_t i = 0; i < V; ++i) {
      acc += row[size_t(i)];
      if (u < acc) { next = int32_t(i); break; }
    }
    ids.push_back(next);
  }
  model.train(was_training);
  return ids;
}

}  // namespace loom::nn
