// The params every tp rank holds whole (layernorms, row-parallel biases, wpe)
// must stay bit-identical: each rank steps its own copy, and they agree only
// because every rank computes the same gradient (without sequence parallelism
// f's all-reduce gives each rank the same input gradient; with it, the partial
// gradients are summed over tp before the step). A missed sum, or a reduction
// whose result differs by a bit between ranks, lets the copies drift apart
// silently - the run still trains, but it is no longer one model.
//
// The check compares a fingerprint (FNV-1a of the bytes) of each such param
// over tp, and names every param whose copies differ. train_gpt runs it at
// every --save, before the checkpoint (which keeps tp rank 0's copies) is written.
#pragma once

#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace loom::parallel {

// Collective over tp. Throws loom::Error "tensor parallel: replicated params
// differ across the tp ranks: ln_1.weight: ..." naming each param and the
// ranks holding each version.
void check_tp_replicas_identical(const nn::NamedTensors& replicated, ProcessGroup& tp);

}  // namespace loom::parallel
