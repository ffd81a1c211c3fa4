// Cross-entropy over a vocabulary split across the tp group (Megatron's
// vocab_parallel_cross_entropy): rank r holds logits [N, V/tp] for the ids
// [r*V/tp, (r+1)*V/tp), and no rank ever holds all V of a row. Per row:
//
//   m   = max over the whole row        local max,        all-reduce MAX
//   S   = sum_v exp(logit_v - m)        local sum,        all-reduce SUM
//   z   = logit_target - m              only the owner of the target has it, all-reduce SUM
//   loss_row = log S - z,   loss = mean over rows whose target != ignore_index
//
// Backward needs no communication: d loss_row / d logit_v = softmax_v - [v == target],
// and each rank has its own softmax_v = exp(logit_v - m) / S.
#pragma once

#include <cstdint>

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::parallel {

// logits: [N, V/tp] (any float dtype; computed in fp32), targets: [N] int,
// vocab_start: the first id this rank holds; vocab_size: the true V, when the
// table was padded to a multiple of tp (columns of ids >= vocab_size are
// padding: left out of the max and the sum, gradient 0; -1: no padding).
// Returns the mean loss (fp32 []), the same on every rank of tp. Collective
// over tp (three all-reduces of N floats).
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    ProcessGroup& tp, int64_t ignore_index = -100, int64_t vocab_size = -1);

}  // namespace loom::parallel
