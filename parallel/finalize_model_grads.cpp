#include "parallel/finalize_model_grads.h"

#include <unordered_set>

#include "parallel/expert_parallel/expert_parallel.h"
#include "parallel/teach/teach_break.h"

namespace loom::parallel {

FinalizeModelGrads::FinalizeModelGrads(Model& model, ProcessGroupManager& pgm)
    : model_(model), pgm_(pgm), tied_embedding_(tied_embedding_handler(*model.chunks, pgm)) {
  if (model.tp)
    for (const Tensor& p : model.tp->sequence_parallel_partial_params(*model.chunks))
      sequence_parallel_partial_grads_.add(p, pgm.tp_group());
}

void FinalizeModelGrads::operator()(DataParallel* dp) {
  // 1. After the data-parallel sync (forward_backward's), which averaged each copy over its own replicas.
  if (!teach::broken(teach::Break::SkipTiedSync)) tied_embedding_.all_reduce_grads(dp);  // --teach-break skip-tied-sync: the copies drift apart
  // 2. (Under ZeRO the wrapper has summed them already, before each reduce-scatter left
  //    only shards: data_parallel_bucket.h, fully_sharded.h)
  if (!dp || !dp->sums_tp_partial_grads()) sequence_parallel_partial_grads_.all_reduce_grads(dp);
}

ProcessGroup* FinalizeModelGrads::grad_stats_group(bool zero) const {
  // --teach-break found-inf-wrong-group: only this stage's dp replicas, so stages decide alone.
  if (teach::broken(teach::Break::FoundInfWrongGroup)) return &pgm_.dp_group();
  if (zero) return &pgm_.instance_group();  // every dp shard too (HSDP: once, not once per replica)
  // Each ep rank holds other experts: their squares add up over ep, with the replica's stages and tp shards.
  if (pgm_.ep_size > 1) return &pgm_.ep_model_parallel_group();
  return pgm_.model_parallel_group().size() > 1 ? &pgm_.model_parallel_group() : nullptr;
}

std::vector<Tensor> FinalizeModelGrads::not_counted(bool zero) const {
  std::vector<Tensor> out;
  // The tied weight once: the last stage's copy is left out.
  const ModelChunks& m = *model_.chunks;
  if (m.is_last_stage() && !m.is_first_stage() && m.embedding_weight().defined()) out.push_back(m.embedding_weight());
  // Tensor parallelism's replicated params once: tp rank 0's copies (all tp ranks' are equal).
  if (model_.tp && pgm_.tp_rank != 0)
    for (const auto& [name, p] : model_.tp->replicated_params(m)) out.push_back(p);
  // Expert parallelism's replicated params (all but the experts) once: ep rank 0's (the norm is summed over ep).
  // Under ZeRO (the norm over the world) each element is on one rank: the rest sharded over dp, the
  // experts over their expert-dp group.
  if (pgm_.ep_size > 1 && !zero && pgm_.ep_rank != 0) {
    std::unordered_set<const TensorImpl*> experts;
    for (const Tensor& p : expert_params(*model_.chunks)) experts.insert(p.impl());
    for (const auto& [name, p] : m.named_parameters())
      if (!experts.count(p.impl())) out.push_back(p);
  }
  return out;
}

}  // namespace loom::parallel
