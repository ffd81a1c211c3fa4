// The GPT's optimizer param groups, as nanoGPT's configure_optimizers makes
// them: weight decay on the matmul weights
// (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) only; biases, LayerNorm
// parameters and the (tied) embeddings go in a no-decay group.
#pragma once

#include "nn/module.h"
#include "optim/optimizer.h"

namespace loom::optim {

// Groups {"decay", "no_decay"}, params in named_parameters() order.
std::vector<ParamGroup> gpt_param_groups(const nn::Module& model, double lr, double weight_decay);

}  // namespace loom::optim
