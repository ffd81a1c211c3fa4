// Activation recomputation for the GPT's layers (train_gpt --recompute): which
// regions of each transformer block keep only their inputs and run again in
// backward (autograd/checkpoint.h). Korthikanti et al. 2022, "Reducing
// activation recomputation in large transformer models" (Megatron's names):
//
//   none        every activation kept: per block 4 + (12 + a s / h) / t units of [b, s, h]
//   selective   the attention core (scores, softmax, dropout, weighting) rerun:
//               its [b, a, s, s] tensors are not kept, q, k, v are: 4 + 12 / t units
//   full        each block rerun: only its input is kept, 1 unit; backward
//               pays one more forward of every block
//
// Applied where the layers are made (a LayerBuilder), so every model - one
// process, a pipeline stage, a tp shard - gets it the same way, and the
// parameters keep their names and order.
#pragma once

#include <string>

#include "parallel/model_chunks.h"

namespace loom::parallel {

enum class Recompute { None, Selective, Full };

// "none" | "selective" | "full"; anything else is an error naming the three.
Recompute parse_recompute(const std::string& name);

// The builder's layers with recomputation: each block (every layer but the
// embedding and the head) wrapped in a checkpoint (full), or its attention
// core (selective: the seam nn/attention.h gives, whatever core is there).
LayerBuilder with_recompute(LayerBuilder builder, const nn::GPTConfig& cfg, Recompute mode);

}  // namespace loom::parallel
