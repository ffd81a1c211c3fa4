#include "nn/moe_bias_state.h"

#include <map>

#include "nn/moe.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {

// Every MoE layer under m with its path ("blocks.0.moe"), in module order.
void collect(Module& m, const std::string& path, std::vector<std::pair<std::string, MoE*>>& out) {
  if (MoE* moe = m.as_moe()) out.push_back({path, moe});
  for (const auto& [name, child] : m.named_children()) collect(*child, path.empty() ? name : path + "." + name, out);
}

std::vector<std::pair<std::string, MoE*>> named_moe_layers(Module& root) {
  std::vector<std::pair<std::string, MoE*>> found;
  collect(root, "", found);
  return found;
}

}  // namespace

NamedTensors router_biases(Module& root) {
  NamedTensors out;
  for (const auto& [path, moe] : named_moe_layers(root))
    if (moe->score_bias.defined()) out.push_back({path + ".score_bias", moe->score_bias});
  return out;
}

std::vector<std::string> load_router_biases(Module& root, const NamedTensors& saved, const std::string& source) {
  std::map<std::string, Tensor> by_name(saved.begin(), saved.end());
  std::vector<std::pair<Tensor, Tensor>> copies;  // (ours, saved)
  std::vector<std::string> missing;
  for (const auto& [path, moe] : named_moe_layers(root)) {
    const std::string name = path + ".score_bias";
    auto it = by_name.find(name);
    if (!moe->score_bias.defined()) {
      LOOM_CHECK(it == by_name.end(), source, " holds the routing biases of a --router-bias-update-rate run (", name,
                 " ...): without the flag its experts would be chosen without them; pass --router-bias-update-rate");
      continue;
    }
    if (it == by_name.end()) {
      missing.push_back(name);
      continue;
    }
    LOOM_CHECK(it->second.shape() == moe->score_bias.shape(), source, ": ", name, " is ", it->second.describe(),
               ", expected [", moe->o.experts, "] (one bias per expert)");
    copies.push_back({moe->score_bias, it->second});
  }
  for (auto& [ours, theirs] : copies) ops::copy_(ours, ops::to(theirs, ours.device(), ours.dtype()));
  return missing;
}

}  // namespace loom::nn
