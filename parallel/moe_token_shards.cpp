#include "parallel/moe_token_shards.h"

#include "nn/moe.h"
#include "tensor/ops.h"

namespace loom::parallel {

void use_moe_token_shards(nn::Module& model, ProcessGroup* sp_tp, ProcessGroup* cp) {
  if ((!sp_tp || sp_tp->size() == 1) && (!cp || cp->size() == 1)) return;  // every rank holds its whole micro-batch
  nn::TokenShards shards;
  shards.sum = [sp_tp, cp](std::vector<double>& v) {
    Tensor t = from_vector(v, {int64_t(v.size())});  // counts are integers below 2^53: exact in float64
    for (ProcessGroup* g : {sp_tp, cp})
      if (g && g->size() > 1) g->all_reduce(t, ReduceOp::Sum);
    v = t.to_vector<double>();
  };
  shards.summed_ranks = sp_tp ? sp_tp->size() : 1;
  for (nn::MoE* moe : nn::moe_layers(model)) moe->token_shards = shards;
}

}  // namespace loom::parallel
