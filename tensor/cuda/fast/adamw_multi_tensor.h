// One-launch AdamW (issue 44): every param of one storage dtype in one kernel.
// What it does that the reference (optim.cu's adamw_kernel, a launch per
// param) does not: the params, moments and gradients are reached through a
// table uploaded once (pointers and AdamW scalars a tensor, and the chunk
// table of kernels/tensor_chunks.h), and block b updates chunk b. A GPT-2
// small has ~150 params: ~150 launches of ~5 us host time each (and a gap on
// the GPU between each pair) become one launch and one upload of ~0.5 MB (16
// bytes a chunk: 124M / 4096 chunks; 64 bytes a param). The table is built
// and uploaded again each step (the scalars change); caching the chunk part
// across steps is the next saving.
// The element math is kernels::adamw_update, the reference kernel's, with the
// same conversions: the same bits (tests/cuda/test_cuda_optim_multi_tensor.cpp).
#pragma once

#include <vector>

#include "tensor/kernels/adamw.h"
#include "tensor/tensor.h"

namespace loom::cuda {

// p[i]: a contiguous fp32, bf16 or fp16 param on the GPU, all of one dtype and
// one device; m[i], v[i], g[i]: contiguous fp32 of p[i]'s size there; s[i]:
// p[i]'s scalars this step. 0-element params are allowed (nothing to do).
void adamw_multi_tensor(const std::vector<Tensor>& p, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                        const std::vector<Tensor>& g, const std::vector<kernels::AdamWScalars<float>>& s);

}  // namespace loom::cuda
