#include "parallel/expert_parallel/expert_parallel.h"

#include <map>
#include <set>

#include "nn/moe.h"
#include "parallel/expert_parallel/token_dispatcher_all_to_all.h"
#include "tensor/ops.h"

namespace loom::parallel {

void use_expert_parallel(nn::Module& model, ProcessGroup& ep) {
  for (nn::MoE* moe : nn::moe_layers(model)) {
    const int64_t E = moe->o.experts, n = ep.size();
    LOOM_CHECK(E % n == 0 && int64_t(moe->experts->size()) == E, "expert parallelism: ep ", n, " does not divide ",
               E, " experts (this layer holds ", moe->experts->size(), ")");
    // Experts [r L, (r + 1) L) of this rank r, named by their global index; the others go.
    const int64_t L = E / n, first = ep.rank() * L;
    auto local = std::make_shared<nn::ExpertList>(first);
    for (int64_t j = 0; j < L; ++j) local->push_back((*moe->experts)[size_t(first + j)]);
    moe->replace_module("experts", local);
    moe->experts = local;
    std::vector<std::shared_ptr<nn::Expert>> experts(local->begin(), local->end());
    moe->expert_step = [experts, &ep](const Tensor& permuted, const std::vector<int64_t>& tokens_per_expert) {
      return dispatch_compute_combine(permuted, tokens_per_expert, experts, ep);
    };
  }
}

std::vector<Tensor> expert_params(nn::Module& model) {
  std::vector<Tensor> params;
  for (nn::MoE* moe : nn::moe_layers(model))
    for (const Tensor& p : moe->experts->parameters()) params.push_back(p);
  return params;
}

ExpertParams expert_data_parallel_params(nn::Module& model, ProcessGroupManager& pgm) {
  if (pgm.ep_size == 1) return {};
  // HSDP (ZeRO-3 only): over the expert-dp ranks of this rank's shard group; the replicas average after.
  return {expert_params(model), &pgm.expert_dp_shard_cp_group(), 1.0 / double(pgm.ep_size)};
}

namespace {

// "blocks.1.moe.experts.3.w1.weight" with its expert index 3 -> e: the same tensor of expert e.
std::string with_expert_index(const std::string& name, int64_t e) {
  const std::string key = ".experts.";
  const size_t at = name.find(key);
  LOOM_CHECK(at != std::string::npos, "gather_experts: '", name, "' is not an expert's");
  const size_t start = at + key.size(), end = name.find('.', start);
  return name.substr(0, start) + std::to_string(e) + name.substr(end);
}

}  // namespace

nn::NamedTensors gather_experts(nn::Module& model, const nn::NamedTensors& state, ProcessGroup& ep) {
  // Which entries are experts, and each one's layer: its local index j -> global (s L + j) on rank s.
  std::map<const TensorImpl*, std::pair<int64_t, int64_t>> local;  // param -> (first, L) of its layer
  for (nn::MoE* moe : nn::moe_layers(model))
    for (const Tensor& p : moe->experts->parameters())
      local[p.impl()] = {int64_t(moe->experts->first()), int64_t(moe->experts->size())};
  const nn::NamedTensors params = model.named_parameters();
  std::map<std::string, std::pair<int64_t, int64_t>> by_name;
  for (const auto& [name, p] : params)
    if (local.count(p.impl())) by_name[name] = local.at(p.impl());
  // Each layer's gathered experts are listed where its first local expert was, in global order.
  nn::NamedTensors out;
  std::map<std::string, nn::NamedTensors> gathered;  // the first local expert tensor's name -> all ranks' of the layer
  std::set<std::string> done;                        // layers' experts prefix already listed
  const int64_t n = ep.size();
  for (const auto& [name, t] : state) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      out.push_back({name, t});
      continue;
    }
    const auto [first, L] = it->second;
    const std::string layer = name.substr(0, name.find(".experts.") + 9);  // "blocks.1.moe.experts."
    if (!done.insert(layer).second) continue;
    // Every expert tensor of this layer: all-gathered over ep, [n, ...] -> rank s's experts s L + j.
    std::map<int64_t, nn::NamedTensors> by_expert;
    for (const auto& [other, u] : state) {
      auto o = by_name.find(other);
      if (o == by_name.end() || other.rfind(layer, 0) != 0) continue;
      const int64_t j = std::stoll(other.substr(layer.size())) - first;
      Shape shape = u.shape();
      shape.insert(shape.begin(), n);
      Tensor all = empty(shape, u.dtype(), u.device());  // [n, ...]
      ep.all_gather(all, ops::contiguous(u));
      for (int64_t s = 0; s < n; ++s)
        by_expert[s * L + j].push_back({with_expert_index(other, s * L + j), ops::clone(ops::reshape(ops::narrow(all, 0, s, 1), u.shape()))});
    }
    for (auto& [e, tensors] : by_expert)
      for (auto& named : tensors) out.push_back(std::move(named));
  }
  return out;
}

}  // namespace loom::parallel
