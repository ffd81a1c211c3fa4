// ParamGatherOverlap: ZeRO-1's param all-gather overlapped with the next
// forward (Megatron-LM's overlap_param_gather). Works with clipping and loss
// scaling, unlike the early steps of zero_overlap.h: the step itself stays
// where it is, after the whole backward; only the wait for its all-gathers
// moves.
//
// Without it, DistributedOptimizer::step() launches one all-gather per bucket
// and finish_param_sync() waits for all of them before the next forward:
//   comm     | gather b2 | gather b1 | gather b0 |
//   compute  | step      (waits ...........................)| F emb | F block0 | F block1 | F head |
// With it, each layer's forward pre-hook waits only for the buckets holding its
// own params. step() launches the gathers last bucket first: buckets are laid
// out in reverse module order (bucket.h), so the last bucket holds the first
// layers, which the next forward reads first (Megatron gathers in that order too):
//   comm     | gather b2 | gather b1    | gather b0       |
//   compute  | step      | F emb        | F block0        | F block1 | F head |
//                 (emb's hook waits for b2; block0's for b1 ...)
// A layer waits for every bucket it reads that is still in flight, so a
// param shared by two layers (the tied embedding, read by the embedding and
// the head) is waited for by the first of them.
//
//   ParamGatherOverlap overlap(opt, model.layers());   // before the first forward
//   for (step...) { loss = forward(...); backward(loss); opt.step(); dp.reset(); }  // no finish_param_sync()
// What reads params outside a forward (evaluation under another module,
// a checkpoint) still calls opt.finish_param_sync() first.
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace loom::optim {

class DistributedOptimizer;

class ParamGatherOverlap {
 public:
  // layers: the modules a forward calls, in forward order (GPT::layers(), a
  // pipeline stage's layers). A forward pre-hook on each, while this lives.
  ParamGatherOverlap(DistributedOptimizer& opt, const std::vector<std::shared_ptr<nn::Layer>>& layers);

  // The buckets whose all-gather layer i's pre-hook waits for (its params' buckets).
  const std::vector<std::vector<int>>& buckets_of_layer() const { return buckets_of_layer_; }

 private:
  std::vector<std::vector<int>> buckets_of_layer_;  // [layer] -> buckets, ascending
  std::vector<autograd::RemovableHandle> hooks_;
};

}  // namespace loom::optim
