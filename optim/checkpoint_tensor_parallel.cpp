#include "optim/checkpoint_tensor_parallel.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

// The state of `params` (some of this rank's) as full tensors, joined over tp and over `holders` (their
// replicas, or under ZeRO their shards); on tp rank 0 of holders' rank 0, else nothing. Collective over both.
nn::NamedTensors join_over(const MixedPrecisionOptimizer& opt, const nn::NamedTensors& params,
                           const TensorParallelShards& tp, parallel::ProcessGroup& holders) {
  // 1. The layout: param i's kind k at offset[i] + k (numel_i + 1) (the last slot: padding).
  std::unordered_map<const TensorImpl*, size_t> index_of;
  std::vector<int64_t> offset, numel;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    index_of.emplace(p.impl(), i);
    numel.push_back(numel_of(tp.maps->at(name).full_shape));
    offset.push_back(total);
    total += 3 * (numel.back() + 1);
  }
  Tensor placed = zeros({total}, kFloat64);
  Tensor steps = zeros({int64_t(params.size())}, kFloat64);  // AdamW's step count of each param

  // 2. This rank's elements at their full positions.
  const bool dp_writes = tp.zero || holders.rank() == 0;  // without ZeRO the replicas are equal
  for (size_t j = 0; j < opt.main_params().size(); ++j) {
    const MainParam& m = opt.main_params()[j];
    const auto found = index_of.find(m.model_param.impl());
    if (found == index_of.end()) continue;  // joined in the other call (an expert, or not one)
    const size_t i = found->second;
    const parallel::ShardMap& map = tp.maps->at(params[i].first);
    if (!dp_writes || (map.replicated && tp.tp->rank() != 0)) continue;
    const AdamWState& st = opt.adam_state(j);
    const Tensor idx = ops::narrow(map.index, 0, m.start, m.end - m.start);
    const Tensor state[] = {m.main, st.exp_avg, st.exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      Tensor block = ops::narrow(placed, 0, offset[i] + k * (numel[i] + 1), numel[i] + 1);
      ops::add_(block, ops::index_add(block, 0, idx, ops::to(ops::reshape(state[k], {-1}), kFloat64)));
    }
    ops::fill_(ops::narrow(steps, 0, int64_t(i), 1), st.step.item<double>());
  }

  // 3. Joined: over tp, and over the holders where they own disjoint ranges.
  tp.tp->all_reduce(placed, parallel::ReduceOp::Sum);
  tp.tp->all_reduce(steps, parallel::ReduceOp::Max);
  if (tp.zero) {
    holders.all_reduce(placed, parallel::ReduceOp::Sum);
    holders.all_reduce(steps, parallel::ReduceOp::Max);
  }
  if (tp.tp->rank() != 0 || holders.rank() != 0) return {};

  const char* kinds[] = {"main", "exp_avg", "exp_avg_sq"};
  const std::vector<double> step_values = steps.to_vector<double>();
  nn::NamedTensors out;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string key = "/" + params[i].first + "/0";
    for (int k = 0; k < 3; ++k)
      out.push_back({kinds[k] + key, ops::to(ops::narrow(placed, 0, offset[i] + k * (numel[i] + 1), numel[i]),
                                             kFloat32)});
    out.push_back({"step" + key, full({}, step_values[i], kInt64)});
  }
  return out;
}

}  // namespace

nn::NamedTensors full_optimizer_fragments(const MixedPrecisionOptimizer& opt, const nn::NamedTensors& params,
                                          const TensorParallelShards& tp) {
  NoGradGuard no_grad;
  // Under ep the experts apart: the same slots of two ep ranks hold other experts (the header).
  std::unordered_set<const TensorImpl*> is_expert;
  for (const Tensor& p : tp.experts) is_expert.insert(p.impl());
  nn::NamedTensors dense, experts;
  for (const auto& [name, p] : params) (is_expert.count(p.impl()) ? experts : dense).push_back({name, p});
  nn::NamedTensors out = join_over(opt, dense, tp, *tp.dp);
  if (experts.empty()) return out;  // no ep, or a stage without MoE layers (as its whole expert-dp and tp groups)
  LOOM_CHECK(tp.expert_dp, "full_optimizer_fragments: ", experts.size(), " experts and no expert-dp group");
  for (auto& fragment : join_over(opt, experts, tp, *tp.expert_dp)) out.push_back(std::move(fragment));
  return out;
}

Tensor join_fragments(const std::vector<OptimizerFragment>& fragments, int64_t numel, const std::string& what,
                      const std::string& index_path) {
  Tensor whole = zeros({numel}, kFloat32);
  std::vector<char> seen(size_t(numel), 0);
  for (const OptimizerFragment& f : fragments) {
    LOOM_CHECK(f.start >= 0 && f.start + f.t.numel() <= numel, "checkpoint '", f.file, "': ", what, "/", f.start,
               " holds ", f.t.numel(), " elements from ", f.start, ", past the end of its ", numel,
               "; is this another model's checkpoint?");
    LOOM_CHECK(f.t.dtype() == kFloat32, "checkpoint '", f.file, "': ", what, " is ", f.t.describe(),
               ", expected float32");
    ops::copy_(ops::narrow(whole, 0, f.start, f.t.numel()), ops::reshape(f.t, {-1}));
    std::fill(seen.begin() + f.start, seen.begin() + f.start + f.t.numel(), 1);
  }
  const int64_t covered = std::count(seen.begin(), seen.end(), 1);
  LOOM_CHECK(covered == numel, "checkpoint '", index_path, "': ", what, " has ", covered, " of its ", numel,
             " elements in the listed shards; is a shard file missing, or is this another model?");
  return whole;
}

}  // namespace loom::optim
