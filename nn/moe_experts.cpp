#include "nn/moe_experts.h"

namespace loom::nn {

Tensor expert_compute(const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert,
                      const std::vector<std::shared_ptr<Expert>>& experts) {
  LOOM_CHECK(tokens_per_expert.size() == experts.size(), "expert_compute: ", tokens_per_expert.size(),
             " group sizes for ", experts.size(), " experts");
  std::vector<Tensor> outputs;
  int64_t row = 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    const Tensor group = autograd::narrow(permuted, 0, row, tokens_per_expert[e]);  // [M_e, C]
    outputs.push_back(experts[e]->forward(group));
    row += tokens_per_expert[e];
  }
  LOOM_CHECK(row == permuted.size(0), "expert_compute: the groups hold ", row, " rows, the permuted tokens ",
             permuted.size(0));
  return autograd::cat(outputs, 0);  // [M, C], in the same expert order
}

}  // namespace loom::nn
