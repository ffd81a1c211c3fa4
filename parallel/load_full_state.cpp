#include "parallel/load_full_state.h"

#include <map>

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

void load_full_state(Model& m, const nn::NamedTensors& full) {
  const std::map<std::string, Tensor> by_name(full.begin(), full.end());
  NoGradGuard no_grad;  // copying into leaves that require grad is not part of any graph
  for (const auto& [name, param] : m.chunks->named_parameters()) {
    auto it = by_name.find(name);
    LOOM_CHECK(it != by_name.end(), "load_full_state: the state has no '", name, "' (", param.shape(), ")");
    // Under tp this rank's elements of the full tensor; a last stage's wte is the full one too.
    const Tensor src = m.tp ? cut_shard(it->second, m.tp->shard_maps().at(name)) : it->second;
    LOOM_CHECK(src.numel() == param.numel(), "load_full_state: '", name, "' has ", src.numel(),
               " elements, this rank's parameter ", param.shape(), " holds ", param.numel());
    ops::copy_(param, ops::to(ops::reshape(src, param.shape()), param.device()));
  }
}

}  // namespace loom::parallel
