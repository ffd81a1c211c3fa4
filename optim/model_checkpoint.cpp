#include "optim/model_checkpoint.h"

#include <filesystem>

#include "nn/dropout.h"
#include "nn/moe.h"
#include "nn/moe_bias_state.h"
#include "optim/checkpoint_tensor_parallel.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "parallel/pipeline_parallel/gather_model.h"
#include "parallel/tensor_parallel/replicas.h"
#include "tensor/ops.h"

namespace loom::optim {

void save_model_checkpoint(const std::string& path, parallel::Model& m, MixedPrecisionOptimizer& opt,
                           const nn::GPTConfig& cfg, const std::string& vocab_utf8, int64_t steps_done,
                           const std::array<uint64_t, 4>& data_rng, parallel::ProcessGroupManager& pgm) {
  opt.finish_param_sync();
  // The whole model's params on rank 0 (a pipeline's stages gathered, tp shards joined), as host copies.
  nn::NamedTensors full = parallel::gather_full_state(m, pgm);
  // The routing biases, beside the weights: replicated over dp, so rank 0's
  // copies; in a pipeline each stage's, gathered on pp rank 0 as its weights are.
  nn::NamedTensors biases = nn::router_biases(*m.chunks);
  if (pgm.pp_size > 1 && cfg.moe.bias_update_rate > 0)
    biases = parallel::gather_stage_states(*m.chunks, pgm.pp_group(), &biases);
  if (pgm.global_rank == 0)
    for (const auto& [name, b] : biases) full.push_back({name, ops::clone(ops::to(b, kCPU))});
  if (pgm.global_rank == 0) {
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
  }
  pgm.world().barrier();  // the directory exists before any rank writes its shard
  const nn::NamedTensors params = m.chunks->named_parameters();
  const TrainState state{steps_done, data_rng, nn::dropout_offset(*m.chunks), {}};
  // The ranks holding this stage's optimizer state between them: under ZeRO the
  // group the optimizer shards over (dp x cp: the cp ranks own ranges too), else
  // the dp x cp replicas, whose state is the same (their gradients are averaged together);
  // under ep the replicas of this rank's experts (expert-dp x cp), each ep rank's first one
  // writing its experts and a copy of the replicated state, by global name.
  parallel::ProcessGroup* shards = opt.shard_group();
  parallel::ProcessGroup& holders = shards ? *shards : pgm.ep_size > 1 ? pgm.expert_dp_group() : pgm.dp_cp_group();
  // HSDP: the shard group's state is replicated dp / dp-shard times; the first replica writes it.
  const bool first_replica = pgm.dp_replicate_rank == 0;
  if (m.tp) {
    // tp rank 0's copies are saved: first, that the other ranks' are the same bits.
    parallel::check_tp_replicas_identical(m.tp->replicated_params(*m.chunks), pgm.tp_group());
    // Under ep the experts are joined over expert-dp, where they are replicated or (ZeRO) sharded; each
    // ep rank's first returns them, beside dp rank 0's joined dense state under ZeRO.
    const bool ep = pgm.ep_size > 1;
    nn::NamedTensors joined = full_optimizer_fragments(
        opt, params, {&m.tp->shard_maps(), &pgm.tp_group(), &holders, shards != nullptr,
                      ep ? parallel::expert_params(*m.chunks) : std::vector<Tensor>{},
                      ep ? &pgm.expert_dp_group() : nullptr});
    save_checkpoint(path, full, cfg, vocab_utf8, opt, params, state, pgm.world(), first_replica && !joined.empty(),
                    &joined);
  } else {
    // Under ZeRO every rank its own shard; else one copy of the replicated state (under ep one per ep rank).
    save_checkpoint(path, full, cfg, vocab_utf8, opt, params, state, pgm.world(),
                    first_replica && (shards || holders.rank() == 0));
  }
}

TrainState load_model_checkpoint(const std::string& path, parallel::Model& m, MixedPrecisionOptimizer& opt) {
  // Every rank reads the manifest and the shards it needs.
  TrainState s = load_checkpoint(path, opt, m.chunks->named_parameters(), m.tp ? &m.tp->shard_maps() : nullptr);
  nn::set_dropout_offset(*m.chunks, s.dropout_offset);  // the next masks are those the saved run would have drawn
  if (!nn::moe_layers(*m.chunks).empty()) {  // the routing biases, from the model file (where they are)
    nn::SafetensorsFile piece = load_model_piece(path);
    s.router_biases_missing = nn::load_router_biases(*m.chunks, piece.tensors, "checkpoint '" + path + "'");
  }
  return s;
}

}  // namespace loom::optim
