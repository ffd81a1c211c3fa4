// nanoGPT's optimizer grouping for the GPT: weight decay on the matmul weights
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) only; biases, LayerNorm
// parameters and the (tied) embeddings go in a no-decay group.
#pragma once

#include "nn/module.h"
#include "optim/optimizer.h"

namespace loom::train {

// Groups {"decay", "no_decay"}, params in named_parameters() order.
std::vector<optim::ParamGroup> gpt_param_groups(const nn::Module& model, double lr, double weight_decay);

}  // namespace loom::train
