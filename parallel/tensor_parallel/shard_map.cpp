#include "parallel/tensor_parallel/shard_map.h"

#include "parallel/tensor_parallel/gpt.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// Every parameter of `layers`, by the name ModelChunks gives it.
nn::NamedTensors named_params(const std::vector<std::shared_ptr<nn::Layer>>& layers, const nn::GPTConfig& cfg,
                              int64_t begin) {
  nn::NamedTensors out;
  for (size_t k = 0; k < layers.size(); ++k) {
    const std::string prefix = nn::gpt_layer_prefix(cfg, begin + int64_t(k));
    for (const auto& [name, p] : layers[k]->named_parameters()) out.emplace_back(prefix + name, p);
  }
  return out;
}

}  // namespace

ShardMaps tensor_parallel_shard_maps(const std::vector<std::shared_ptr<nn::Layer>>& layers, const nn::GPTConfig& cfg,
                                     int64_t begin, ProcessGroup& tp, bool sp) {
  NoGradGuard no_grad;
  // 1. The full layers, each parameter now holding index + 1 (0 is left for padding).
  std::map<std::string, Shape> full_shapes;
  for (const auto& [name, p] : named_params(layers, cfg, begin)) {
    // float32 holds every integer below 2^24 exactly; a char-level GPT's largest
    // tensor (4C x C) stays far below it (C = 2048 gives 2^24).
    LOOM_CHECK(p.numel() < (int64_t(1) << 24), "tensor parallel shard map: ", name, " ", p.describe(),
               " has 2^24 elements or more, past float32's exact integers");
    ops::copy_(p, ops::view(arange(1.0, double(p.numel()) + 1.0), p.shape()));
    full_shapes[name] = p.shape();
  }
  // 2. Cut exactly as the real weights are cut; each shard says where it came from.
  ShardMaps maps;
  for (const auto& [name, shard] : named_params(cut_gpt_layers_for_tp(layers, cfg, begin, tp, sp), cfg, begin)) {
    const Shape& shape = full_shapes.at(name);
    const int64_t numel = numel_of(shape);
    Tensor one_based = ops::to(ops::reshape(shard, {-1}), kInt64);
    // padding (0) -> numel, the slot past the end; everything else back to 0-based
    Tensor index = ops::where(ops::to(one_based, kFloat32), ops::add(ops::to(one_based, kFloat64), -1.0),
                              full({one_based.numel()}, double(numel), kFloat64));
    maps[name] = ShardMap{shape, ops::to(index, kInt64), shard.numel() == numel};
  }
  return maps;
}

Tensor gather_full(const Tensor& shard, const ShardMap& map, ProcessGroup& tp) {
  NoGradGuard no_grad;
  const int64_t numel = numel_of(map.full_shape);
  LOOM_CHECK(shard.numel() == map.index.numel(), "gather_full: shard ", shard.describe(), " does not match its map (",
             map.index.numel(), " elements)");
  if (tp.size() == 1) return ops::reshape(ops::clone(shard), map.full_shape);
  // [numel + 1]: this rank's elements placed, the padding slot last; float64 holds every dtype's values exactly.
  Tensor placed = zeros({numel + 1}, kFloat64);
  if (!map.replicated || tp.rank() == 0)
    placed = ops::index_add(placed, 0, map.index, ops::to(ops::reshape(shard, {-1}), kFloat64));
  tp.all_reduce(placed, ReduceOp::Sum);
  return ops::to(ops::reshape(ops::narrow(placed, 0, 0, numel), map.full_shape), shard.dtype());
}

Tensor cut_shard(const Tensor& full_tensor, const ShardMap& map) {
  NoGradGuard no_grad;
  const int64_t numel = numel_of(map.full_shape);
  LOOM_CHECK(full_tensor.numel() == numel, "cut_shard: ", full_tensor.describe(), " is not a full ",
             map.full_shape, " (", numel, " elements)");
  Tensor with_padding = ops::cat({ops::reshape(full_tensor, {-1}), zeros({1}, full_tensor.dtype())}, 0);
  return ops::index_select(with_padding, 0, map.index);  // flat [shard numel]
}

TensorParallelParamCount count_params(const ShardMaps& maps, int tp_size) {
  TensorParallelParamCount c;
  c.tp = tp_size;
  for (const auto& entry : maps) {
    const ShardMap& map = entry.second;
    const int64_t full_numel = numel_of(map.full_shape);
    if (map.replicated) {
      c.replicated += full_numel;
    } else {
      c.split += full_numel;
      c.padding += map.index.numel() * tp_size - full_numel;
    }
  }
  return c;
}

}  // namespace loom::parallel
