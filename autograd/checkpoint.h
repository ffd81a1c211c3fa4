// Activation checkpointing (torch.utils.checkpoint, the re-entrant kind;
// Chen et al. 2016, "Training deep nets with sublinear memory cost"): run a
// region of the forward without recording its graph, keep only its inputs,
// and in backward run the region again, with grad on, to rebuild what its
// backward needs. Memory for compute: one more forward of the region.
//
//   forward    y = fn(x)                under NoGradGuard: nothing inside is kept
//              saved: x, the region's dropout offsets
//   backward   x' = detach(x), requires grad
//              y' = fn(x')              the same offsets: the same dropout masks
//              backward(y', dy)         re-entrant: params' AccumulateGrad (and
//                                       their hooks) fire here, once
//              return x'.grad
#pragma once

#include <functional>
#include <vector>

#include "autograd/node.h"
#include "tensor/generator.h"

namespace loom::autograd {

// The region: inputs -> outputs. It must compute the same function when run
// again (the same ops on the same inputs; random draws only through `rng`).
using CheckpointFn = std::function<TensorList(const TensorList& inputs)>;

// Runs fn(inputs) so that backward reruns it. rng: the Philox generators the
// region draws from (its Dropout layers'); their offsets are saved here and
// put back for the rerun, so it draws the same masks, and left where the
// first run left them afterwards. With grad off, or when no input requires
// grad (nothing would call the backward that reruns fn, and the params inside
// would get no gradient), fn runs as it is, recorded as usual.
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs, std::vector<PhiloxGenerator*> rng = {});

}  // namespace loom::autograd
