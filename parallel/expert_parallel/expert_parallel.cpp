#include "parallel/expert_parallel/expert_parallel.h"

#include "nn/moe.h"
#include "parallel/expert_parallel/token_dispatcher_all_to_all.h"

namespace loom::parallel {

std::unique_ptr<ProcessGroup> make_ep_group(ProcessGroup& dp, int ep) {
  LOOM_CHECK(ep >= 1 && dp.size() % ep == 0, "expert parallelism: ep ", ep, " does not divide dp ", dp.size());
  return dp.split(/*color=*/dp.rank() / ep, /*key=*/dp.rank(), "ep");  // ranks [ep i, ep (i + 1))
}

void use_expert_parallel(nn::Module& model, ProcessGroup& ep) {
  for (nn::MoE* moe : nn::moe_layers(model)) {
    LOOM_CHECK(moe->o.experts % ep.size() == 0, "expert parallelism: ep ", ep.size(), " does not divide ",
               moe->o.experts, " experts");
    std::vector<std::shared_ptr<nn::Expert>> experts(moe->experts->begin(), moe->experts->end());
    moe->expert_step = [experts, &ep](const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert) {
      return dispatch_compute_combine(permuted, tokens_per_expert, experts, ep);
    };
  }
}

}  // namespace loom::parallel
