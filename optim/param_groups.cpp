#include "optim/param_groups.h"

namespace loom::optim {

std::vector<ParamGroup> gpt_param_groups(const nn::Module& model, double lr, double weight_decay) {
  ParamGroup decay{{}, lr, weight_decay, "decay"}, no_decay{{}, lr, 0.0, "no_decay"};
  for (auto& [name, p] : model.named_parameters()) {
    bool is_embedding = name.find("wte") != std::string::npos || name.find("wpe") != std::string::npos;
    (p.dim() == 2 && !is_embedding ? decay : no_decay).params.push_back(p);
  }
  return {decay, no_decay};
}

}  // namespace loom::optim
