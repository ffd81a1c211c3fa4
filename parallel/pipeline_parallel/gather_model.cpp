#include "parallel/pipeline_parallel/gather_model.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

namespace {

// One entry of the full state and the GPT layer it belongs to.
struct Entry {
  int64_t layer;
  std::string name;
  Tensor t;
};

// What one stage contributes: its state dict without the last stage's wte copy
// (pp rank 0 already holds wte.weight, the first stage's), each entry with its
// layer. A stage holds its layers in the model's order, but with chunks
// (virtual stages) not contiguously: rank 0 of pp 2 x v 2 has layers 0, 1 and
// 4, 5. So rank 0 orders the gathered entries by layer, which gives
// nn::GPT(cfg).named_parameters()'s order.
// A block's state that is not a parameter (a MoE layer's routing bias,
// blocks.N.moe.score_bias: nn/moe_bias_state.h) goes with its block, found by
// the "blocks.N." prefix.
std::vector<Entry> stage_entries(ModelChunks& stage, const nn::NamedTensors& state, int pp_rank) {
  std::map<std::string, int64_t> layer_of, block_of;  // param name -> layer; "blocks.N." -> layer
  size_t k = 0;
  for (const LayerRange& r : stage.chunks())
    for (int64_t i = r.start; i < r.end; ++i, ++k) {
      const std::string prefix = nn::gpt_layer_prefix(stage.config(), i);
      if (!prefix.empty()) block_of.emplace(prefix, i);
      for (auto& [name, t] : stage.layers()[k]->named_parameters())
        layer_of.emplace(prefix + name, i);  // wte: the embedding's, layer 0
    }
  auto layer = [&](const std::string& name) {
    if (auto it = layer_of.find(name); it != layer_of.end()) return it->second;
    auto block = block_of.find(name.substr(0, name.find('.', std::string("blocks.").size()) + 1));
    LOOM_CHECK(block != block_of.end(), "gather_stage_states: '", name, "' is neither a parameter of this stage nor "
               "in one of its blocks");
    return block->second;
  };
  std::vector<Entry> out;
  for (auto& [name, t] : state)
    if (pp_rank == 0 || name != "wte.weight") out.push_back({layer(name), name, t});
  return out;
}

// The metadata a stage sends ahead of its tensors, so that rank 0 needs to
// know nothing about the other stages (their layer ranges may come from a
// balanced partition it never computed). One int64 list:
//   [count, then per tensor: layer, dtype, ndim, dim_0 .. dim_{ndim-1}, name length, name chars...]
// Names travel as one char per int64: wasteful, but a few hundred bytes per
// stage, against megabytes of weights.
std::vector<int64_t> describe(const std::vector<Entry>& entries) {
  std::vector<int64_t> meta{int64_t(entries.size())};
  for (const auto& [layer, name, t] : entries) {
    meta.push_back(layer);
    meta.push_back(int64_t(t.dtype()));
    meta.push_back(t.dim());
    meta.insert(meta.end(), t.shape().begin(), t.shape().end());
    meta.push_back(int64_t(name.size()));
    for (char c : name) meta.push_back(int64_t(c));
  }
  return meta;
}

// The inverse: empty tensors of the announced names, shapes and dtypes, to receive into.
std::vector<Entry> allocate_described(const std::vector<int64_t>& meta) {
  std::vector<Entry> out;
  size_t i = 0;
  const int64_t count = meta.at(i++);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t layer = meta.at(i++);
    const auto dtype = DType(meta.at(i++));
    const int64_t ndim = meta.at(i++);
    Shape shape(meta.begin() + std::ptrdiff_t(i), meta.begin() + std::ptrdiff_t(i + size_t(ndim)));
    i += size_t(ndim);
    const int64_t len = meta.at(i++);
    std::string name;
    for (int64_t c = 0; c < len; ++c) name.push_back(char(meta.at(i++)));
    out.push_back({layer, name, empty(shape, dtype)});
  }
  return out;
}

}  // namespace

// Every stage but the first sends to pp rank 0, which receives from stage 1,
// then 2, ...: on the group's FIFO thread each send meets its receive in the
// same order on both sides (stage s waits in its first send until rank 0 has
// finished with stage s - 1). Per stage: the metadata's length [1], the
// metadata [length], then each tensor's values. The result is on the CPU
// whatever the stages' device (a checkpoint, a sample): GPU params travel as
// host copies, so every transfer here takes the host path (over NCCL a
// ProcessGroupByDevice sends host tensors through MPI).
nn::NamedTensors gather_stage_states(ModelChunks& stage, ProcessGroup& pp_group, const nn::NamedTensors* state) {
  const int rank = pp_group.rank(), size = pp_group.size();
  // The head on the last rank, or on rank 0 at the top of a V (partition.h).
  LOOM_CHECK(stage.is_first_stage() == (rank == 0) && (!stage.is_last_stage() || rank == 0 || rank == size - 1),
             "gather_stage_states: stage layers [", stage.range().start, ", ", stage.chunks().back().end,
             ") do not match pipeline rank ", rank, " of ", size);
  NoGradGuard no_grad;
  std::vector<Entry> mine = stage_entries(stage, state ? *state : stage.state_dict(), rank);

  if (rank != 0) {
    std::vector<int64_t> meta = describe(mine);
    pp_group.send(from_vector<int64_t>({int64_t(meta.size())}), 0);
    pp_group.send(from_vector<int64_t>(meta), 0);
    for (const Entry& e : mine) pp_group.send(ops::contiguous(ops::to(e.t, kCPU)), 0);
    return {};
  }

  // Rank 0: copies of its own entries (the caller owns the result, and a
  // snapshot must not change when training goes on), then every other stage's.
  std::vector<Entry> all;
  for (const Entry& e : mine)
    all.push_back({e.layer, e.name, e.t.device().is_cpu() ? ops::clone(e.t) : ops::to(e.t, kCPU)});
  for (int src = 1; src < size; ++src) {
    Tensor length = empty({1}, kInt64);
    pp_group.recv(length, src);
    Tensor meta = empty({length.item<int64_t>()}, kInt64);
    pp_group.recv(meta, src);
    for (Entry& e : allocate_described(meta.to_vector<int64_t>())) {
      pp_group.recv(e.t, src);
      all.push_back(std::move(e));
    }
  }
  // The full model's order: by layer, and within a layer as its stage listed them.
  std::stable_sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) { return a.layer < b.layer; });
  nn::NamedTensors full;
  for (Entry& e : all) full.emplace_back(std::move(e.name), std::move(e.t));
  return full;
}

void load_stage_state(ModelChunks& stage, const nn::NamedTensors& full) {
  std::map<std::string, Tensor> by_name(full.begin(), full.end());
  nn::NamedTensors mine;
  std::string missing;
  for (const auto& [name, p] : stage.named_parameters()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) missing += str(missing.empty() ? "" : ", ", name);
    else mine.emplace_back(name, it->second);
  }
  LOOM_CHECK(missing.empty(), "load_stage_state: stage layers [", stage.range().start, ", ", stage.chunks().back().end,
             "): the state has no entry ", missing);
  // Strict: checks every shape before copying anything; copies without recording a graph.
  stage.load_state_dict(mine);
}

}  // namespace loom::parallel
