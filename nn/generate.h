// Sampling from a trained GPT (nanoGPT's GPT.generate): feed the last
// block_size tokens, take the logits of the last position, divide by the
// temperature, keep the top k, and draw from the softmax with a seeded
// generator (so samples are reproducible).
#pragma once

#include <vector>

#include "nn/gpt.h"

namespace loom::nn {

struct SampleOptions {
  int64_t num_tokens = 200;
  double temperature = 1.0;  // > 0; lower is more conservative
  int64_t top_k = 0;         // 0 = all tokens
  uint64_t seed = 0;
};

// Continues `prompt` (token ids, at least one) by opts.num_tokens tokens.
std::vector<int32_t> generate(GPT& model, std::vector<int32_t> prompt, const SampleOptions& opts);

}  // namespace loom::nn
