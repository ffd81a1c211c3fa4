#include "parallel/tensor_parallel/sharding.h"

#include "parallel/tensor_parallel/gpt.h"

namespace loom::parallel {

TensorParallelSharding::TensorParallelSharding(const nn::GPTConfig& cfg, ProcessGroup& tp, bool sequence_parallel)
    : cfg_(cfg), tp_(tp), sequence_parallel_(sequence_parallel) {
  check_tensor_parallel_split(cfg_, tp_.size(), sequence_parallel_);
}

LayerBuilder TensorParallelSharding::layer_builder() {
  LayerBuilder b;
  b.build = [this](int64_t begin, int64_t end) {
    // The full layers (each from its own generator, nn/gpt.h); this rank's
    // shards cut from them; and then - the same layers refilled with element
    // indices - where each shard came from.
    std::vector<std::shared_ptr<nn::Layer>> full = nn::build_gpt_layers(cfg_, begin, end);
    std::vector<std::shared_ptr<nn::Layer>> shards = cut_gpt_layers_for_tp(full, cfg_, begin, tp_, sequence_parallel_);
    shard_maps_.merge(tensor_parallel_shard_maps(full, cfg_, begin, tp_, sequence_parallel_));
    return shards;
  };
  b.sequence_split = sequence_parallel_ ? tp_.size() : 1;
  return b;
}

nn::NamedTensors TensorParallelSharding::replicated_params(const nn::Module& model) const {
  nn::NamedTensors out;
  for (const auto& [name, p] : model.named_parameters())
    if (auto it = shard_maps_.find(name); it != shard_maps_.end() && it->second.replicated) out.emplace_back(name, p);
  return out;
}

std::vector<Tensor> TensorParallelSharding::sequence_parallel_partial_params(const nn::Module& model) const {
  std::vector<Tensor> out;
  if (!sequence_parallel_) return out;
  for (const auto& [name, p] : replicated_params(model))
    if (name != "wpe.weight") out.push_back(p);
  return out;
}

nn::NamedTensors TensorParallelSharding::full_state_dict(nn::Module& model) const {
  nn::NamedTensors out;
  for (const auto& [name, t] : model.state_dict()) out.emplace_back(name, gather_full(t, shard_maps_.at(name), tp_));
  return out;
}

}  // namespace loom::parallel
