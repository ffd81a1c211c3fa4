#include "examples/train_setup.h"

#include "nn/moe_token_dispatcher.h"
#include "optim/build_optimizer.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "parallel/tensor_parallel/gpt.h"
#include "tensor/cuda/kernel_choice.h"
#include "train/device.h"
#include "train/say.h"

namespace loom::train {

parallel::Model build_model(const nn::GPTConfig& cfg, const Args& a, parallel::ProcessGroupManager& pgm) {
  parallel::Model m = parallel::build_model(cfg, pgm, {a.partition, a.virtual_stages, a.sequence_parallel, a.recompute,
                                                      parallel::schedule_chunk_layout(a.schedule)});
  move_to_device(m, a);
  const bool rank0 = pgm.global_rank == 0;
  const std::string where = pgm.pp_size > 1 && pgm.tp_size > 1 ? " on pipeline stage 0, tp rank 0"
                            : pgm.pp_size > 1                  ? " on pipeline stage 0"
                            : pgm.tp_size > 1                  ? " on tp rank 0"
                                                               : "";
  say(rank0, "model: GPT %lld layers, %lld heads, %lld embd, block %lld: %lld parameters%s, %s\n",
      (long long)cfg.n_layer, (long long)cfg.n_head, (long long)cfg.n_embd, (long long)cfg.block_size,
      (long long)m.chunks->num_parameters(), where.c_str(), dtype_name(parse_dtype(a.dtype)));
  if (a.recompute != "none") say(rank0, "recompute: %s\n", a.recompute.c_str());
  if (cfg.arch() != "gpt2")  // GPT-2's runs print what they always did
    say(rank0, "architecture: %s: %s, %s, %s MLP width %lld, %lld query heads / %lld kv heads, %s head%s\n",
        cfg.arch().c_str(), cfg.rmsnorm ? "RMSNorm" : "LayerNorm",
        cfg.rope ? str("RoPE base ", cfg.rope_base).c_str() : "learned positions", cfg.swiglu ? "SwiGLU" : "GELU",
        (long long)cfg.ffn_hidden(), (long long)cfg.n_head, (long long)cfg.kv_heads(),
        cfg.tied_embeddings ? "tied" : "untied", cfg.bias ? "" : ", no biases");
  const int64_t tokens = a.batch * cfg.block_size;  // a micro-batch's tokens, which the capacity is counted over
  if (cfg.moe.experts > 0)
    say(rank0, "experts: %lld per block, %lld per token%s, %s%s%s%s\n", (long long)cfg.moe.experts,
        (long long)cfg.moe.experts_per_token,
        cfg.moe.shared_experts ? str(", ", cfg.moe.shared_experts, " shared").c_str() : "",
        cfg.moe.capacity_factor > 0
            ? str("capacity factor ", cfg.moe.capacity_factor, " (ceil(", cfg.moe.capacity_factor, " x ", tokens, " x ",
                  cfg.moe.experts_per_token, " / ", cfg.moe.experts, ") = ",
                  nn::expert_capacity(cfg.moe.capacity_factor, tokens, cfg.moe.experts_per_token, cfg.moe.experts),
                  " slots per expert per micro-batch)").c_str()
            : "dropless",
        cfg.moe.aux_loss_coef > 0 ? str(", aux loss coef ", cfg.moe.aux_loss_coef).c_str() : "",
        cfg.moe.z_loss_coef > 0 ? str(", z-loss coef ", cfg.moe.z_loss_coef).c_str() : "",
        cfg.moe.bias_update_rate > 0 ? str(", bias update rate ", cfg.moe.bias_update_rate).c_str() : "");
  if (a.device != "cpu") {  // each rank's GPU, and how ranks exchange tensors
    if (rank0) std::printf("device: %s, TF32 %s, %s row kernels, backend %s\n", a.device.c_str(), a.tf32 ? "on" : "off",
                           a.cuda_kernels.empty() ? cuda::kernel_choice_name(cuda::kernel_choice()) : a.cuda_kernels.c_str(),
                           a.backend.empty() ? "nccl" : a.backend.c_str());
    if (pgm.world().size() > 1) {
      std::printf("rank %d: %s\n", pgm.global_rank, rank_device(a).str().c_str());
      std::fflush(stdout);
    }
  }
  if (pgm.pp_size > 1)
    say(rank0, "pipeline: %d stages, %s schedule, %s partition\n", pgm.pp_size,
        a.virtual_stages > 1 && a.schedule == "1f1b"
            ? str("interleaved 1f1b (", a.virtual_stages, " chunks per stage)").c_str()
        : a.virtual_stages > 1 ? str(a.schedule, " (2 chunks per stage in a V)").c_str()
                               : a.schedule.c_str(),
        a.partition.c_str());
  if (pgm.cp_size > 1)
    say(rank0, "context parallel: %d ranks, %lld of each sequence's %lld tokens per rank (zig-zag chunks), "
        "attention as a ring\n", pgm.cp_size, (long long)(cfg.block_size / pgm.cp_size), (long long)cfg.block_size);
  if (pgm.tp_size > 1)
    say(rank0, "tensor parallel: %d ranks (heads, MLP and vocabulary split; vocab padded to %lld)%s\n",
        pgm.tp_size, (long long)parallel::padded_vocab_size(cfg.vocab_size, pgm.tp_size),
        a.sequence_parallel ? ", sequence parallel" : "");
  return m;
}

parallel::ProcessGroup* expert_parallel(parallel::Model& m, const Args& a, parallel::ProcessGroupManager& pgm) {
  if (a.ep == 1) return nullptr;
  parallel::use_expert_parallel(*m.chunks, pgm.ep_group());
  say(pgm.global_rank == 0, "expert parallel: ep %d (groups of %d consecutive dp ranks), %lld of %lld experts "
      "held and computed per rank, their gradients reduced over expert-dp groups of %d; tokens dispatched and "
      "combined by all-to-all\n", a.ep, a.ep, (long long)(m.chunks->config().moe.experts / a.ep),
      (long long)m.chunks->config().moe.experts, pgm.expert_dp_group().size());
  return &pgm.ep_group();
}

parallel::DataParallelWrap wrap_data_parallel(parallel::Model& m, const parallel::FinalizeModelGrads& finalize,
                                              const Args& a, parallel::ProcessGroupManager& pgm) {
  // Over dp x cp: each cp rank saw other tokens of the same sequences, so a
  // weight's gradient is summed over cp ranks as over replicas (the dp group when cp = 1).
  parallel::DataParallelOptions o{a.dp_mode, a.bucket_mb, parse_dtype(a.dtype), a.zero, {}, {}, nullptr, nullptr, {}};
  o.fsdp.prefetch = a.zero3_prefetch == "on";
  o.fsdp.reshard_after_forward = a.zero3_reshard_after_forward == "on";
  // --sequence-parallel's partial gradients, summed over tp before ZeRO's reduce-scatter.
  o.tp_partial_grads = finalize.tp_partial_grads();
  o.tp_group = &pgm.tp_group();
  // --dp-shard (HSDP): ZeRO-3 shards over groups of dp-shard dp ranks (x cp), replicated over the rest.
  o.replicate_group = pgm.dp_replicate_group();
  o.experts = parallel::expert_data_parallel_params(*m.chunks, pgm);  // --ep: the experts over expert-dp
  parallel::DataParallelWrap w =
      parallel::wrap_data_parallel(*m.chunks, pgm.dp_shard_cp_group(), o, finalize.needs_whole_grad());
  // --ep under HSDP: the ep group and the experts' shards lie inside each shard group (process_group_manager.h).
  const std::string experts = pgm.ep_size > 1 ? str("; in each group the experts split over ep ", pgm.ep_size,
                                                     ", sharded over expert-dp groups of ",
                                                     pgm.expert_dp_shard_cp_group().size())
                                               : "";
  if (a.zero == 3 && pgm.hybrid_sharded() && pgm.global_rank == 0)
    std::printf("data parallel: %d ranks, hybrid sharded (HSDP): ZeRO-3 over groups of %d ranks, each shard replicated "
                "%d times (its gradient shard all-reduced over the replicas)%s\n", pgm.dp_size, pgm.dp_shard_size,
                pgm.dp_size / pgm.dp_shard_size, experts.c_str());
  else if (a.zero == 3 && pgm.global_rank == 0)
    std::printf("data parallel: %d ranks, fully sharded (ZeRO-3): each layer's params gathered for its forward and "
                "backward, its gradient reduce-scattered\n", pgm.dp_size);
  else if (pgm.dp_size > 1 && pgm.global_rank == 0)
    std::printf("data parallel: %d ranks, %s %s%s\n", pgm.dp_size, a.dp_mode.c_str(),
                a.zero >= 2 ? "reduce-scatter into gradient shards (ZeRO-2)" : a.zero ? "reduce-scatter" : "all-reduce",
                a.dp_mode == "bucket" ? (", buckets of " + str(a.bucket_mb) + " MiB").c_str() : "");
  return w;
}

std::unique_ptr<optim::MixedPrecisionOptimizer> make_optimizer(parallel::Model& m, const parallel::DataParallelWrap& dp,
                                                                const parallel::FinalizeModelGrads& finalize,
                                                                const Args& a, parallel::ProcessGroupManager& pgm) {
  optim::OptimizerOptions o;
  o.lr = a.lr, o.weight_decay = a.weight_decay, o.max_grad_norm = a.grad_clip;
  o.loss_scaling = parse_dtype(a.dtype) == kFloat16;
  o.scaler = {a.loss_scale, a.loss_scale_growth, a.loss_scale_backoff, a.loss_scale_window};
  o.grad_mean_ranks = pgm.dp_cp_group().size();
  o.zero = a.zero, o.overlap_param_gather = a.overlap_param_gather;
  std::unique_ptr<optim::MixedPrecisionOptimizer> opt = optim::build_optimizer(m, dp, finalize, o);
  // --ep under ZeRO: the experts' state is sharded over their expert-dp group instead (distributed_optimizer.h).
  // (HSDP: over the expert-dp ranks inside each shard group, expert_dp_shard_cp.)
  const int holders = pgm.ep_size > 1 ? pgm.expert_dp_shard_cp_group().size() : 0;
  const char* where = pgm.hybrid_sharded() ? " inside each shard group" : "";
  const std::string experts =
      a.zero && pgm.ep_size > 1 ? str(", the experts' over expert-dp groups of ", holders, where) : "";
  if (pgm.global_rank == 0)
    std::printf("optimizer: AdamW on fp32 main params%s%s%s%s\n",
                a.zero == 3   ? ", on the dp shards (ZeRO-3)"
                : a.zero >= 1 ? str(", sharded over dp (ZeRO-", a.zero, ")").c_str()
                              : "",
                experts.c_str(),
                a.overlap_param_gather ? ", param all-gathers overlapped with forward" : "",
                o.loss_scaling ? ", dynamic loss scaling" : "");
  return opt;
}

}  // namespace loom::train
