#include "optim/zero3_activations.h"

#include <algorithm>
#include <vector>

#include "optim/activation_moments.h"
#include "parallel/data_parallel/fully_sharded.h"

namespace loom::optim {

Moments zero3_at(const ActivationCase& c, const Sizes& z, const Moments& at) {
  const Zero3Held& u = c.zero3;
  // One process's .grad tensors at each moment (fp32, every layer's whose backward has run; no earlier
  // block's under full recomputation), of which ZeRO-3 keeps the layer in backward's, in the model's dtype:
  // the head's have gone into its reduce-scatter by the last block's moments.
  ActivationCase one = c;
  one.grad_bytes = 1, one.recompute = parallel::Recompute::None;
  const Moments g = grads_at(one, z);
  const double scale = z.e / 4, head_grads = g.ln_f + (c.has_head ? (c.rmsnorm ? 1 : 2) * z.h * 4 : 0);
  auto block_grads = [&](double grads) { return (grads - head_grads) * scale; };
  const double next = u.prefetch ? 1 : 0;  // the unit prefetched beside the one computing
  // Without reshard after forward the blocks' units are all still gathered from their forward (kept).
  const double kept = u.reshard_after_forward ? 0 : 1, ahead = next * (1 - kept);
  const double resident = kept * (u.before_last + u.resident);
  Moments m;
  m.forward = u.held + u.last_block + next * u.head + resident;
  if (c.has_head) {
    // (A): the loss's backward runs before the head layer's (which prefetches the last block), and (A) is
    // the larger of the two: at.head = max(loss's, head linear's).
    // An earlier backward's deferred reduce-scatter, until the first of the head's own launches (the tied wte
    // copy's, after the head linear's backward; else ln_f's, after (D)).
    const double head = u.held + u.head + resident + kept * u.last_block + u.pending_reduce;
    m.head = head + std::max(0.0, at_head_linear(c, z) + ahead * u.last_block - at.head);
    m.ln_f = head + ahead * u.last_block +  // + the head linear's .grad, or the own unit's reduce-scatter in its place
             (u.head_own_reduce > 0 ? u.head_own_reduce - u.head_own - u.pending_reduce : g.ln_f * scale);
  }
  if (c.blocks == 0) return m;
  // Without the head the deferred reduce-scatter waits for the last block's own.
  const double in_block = u.held + u.last_block + ahead * u.before_last + resident + u.head_reduce +
                          (c.has_head ? 0 : u.pending_reduce);
  m.block = in_block + block_grads(g.block);
  m.gate = in_block + block_grads(g.gate);
  m.moe_rerun = in_block + block_grads(g.block);
  if (c.tp > 1 && c.recompute == parallel::Recompute::Full && c.moe_experts == 0)  // (F), where it exists
    m.rerun_collective = in_block + block_grads(g.rerun_collective);
  // --ep: past the MoE block's backward its experts' unit is reduce-scattered (the head's let go), and
  // their .grad tensors with it (the router's stay, in the block's unit).
  const double experts = u.experts_reduce > 0 ? 4 * double(c.moe_experts) * 3 * z.h * z.F * scale : 0;
  const double past_experts = u.experts_reduce > 0 ? in_block - u.head_reduce + u.experts_reduce - experts : in_block;
  m.ln_2 = past_experts + block_grads(g.ln_2);
  m.attention = past_experts + block_grads(g.attention);
  // (R) its unit's reduce-scatter launched (the head's waited for first): beside the unit's params, all its
  // .grad tensors (the model's dtype) and its flattened fp32 gradient [P], allocated before they are copied in
  // and dropped. Under --ep the experts' unit went earlier, in the head's reduce-scatter's place (not counted).
  // (R') The block before the last, at its c_attn's backward (the block's last large gradient): its params and
  // .grad tensors but ln_1's beside the last block's reduce-scatter still in flight ([P] + [P / dp] fp32), the
  // larger where that shard outweighs a block's activations (dense, --embd 256 --batch 2: 8.3% under without
  // it). Of the activations: both blocks' kept bytes let go but what c_attn's backward still reads or makes -
  // the block's input and ln_1's output and statistics, qkv's gradient [N, (h + 2 kv)/t] (c_attn's dY), its
  // dx and the bias's float64 column sums (its dW and bias gradient are the .grad tensors) - and the residual's
  // gradient (and a received one). Under --recompute full (the checkpoint's count, activation_moments.cpp): at
  // (R') the last block's kept input is let go, and alive, as (R)'s 3 [b, s, h], the earlier block's rerun
  // output, the gradient it came with and the residual's gradient; on a stage without the head also the
  // gradient the stage received, held by the pipeline.
  if (u.experts_reduce == 0) {
    m.unit_reduce = u.held + u.last_block + ahead * u.before_last + resident + u.last_block + 4 * u.last_block / z.e;
    if (u.block_reduce > 0) {
      const double n = (z.h + 2 * kv_width(c)) / z.t, bias = c.bias && c.tp == 1 ? 1 : 0;
      const double c_attn = linear_backward_temporaries(z.N, z.h, n, z.e, bias > 0, z.native) - z.e * n * z.h -
                            bias * z.e * n;
      // What c_attn's backward reads and makes (ln_1's output, qkv's gradient, its temporaries), or then ln_1's
      // (its incoming gradient, c_attn's dx, and its own temporaries: in 16-bit fp32 copies, the larger where the
      // GEMMs read bf16 natively); the block's input and ln_1's statistics beside either.
      const double incoming = c.sequence_parallel ? z.local : z.unit;
      const double reads = z.stats + std::max(z.unit + z.N * n * z.e + c_attn,
                                              incoming + norm_backward_temporaries(z.Ns, z.h, z.e, c.rmsnorm));
      const double activations = c.recompute == parallel::Recompute::Full
                                     ? at.unit_reduce - z.local + (c.has_head ? 0 : z.local) + reads
                                     : at.unit_reduce - block_kept_now(c, z) + z.local + reads;
      const double ln_1 = (c.rmsnorm ? 1 : 2) * z.h * z.e;
      const double units = u.held + u.earlier_block + ahead * u.before_earlier +
                           kept * (u.before_earlier + u.resident_rerun) + u.earlier_block - ln_1 + u.block_reduce;
      m.unit_reduce = std::max(m.unit_reduce, activations + units - at.unit_reduce);
    }
  }
  return m;
}

Zero3InB zero3_in_b(const Zero3Held& u, bool has_head) {
  // As zero3_at's, without the .grad tensors and reduce-scatters; without reshard after forward the earlier
  // layers' units are still gathered from their forward (resident, and the one before the last block).
  const double kept = u.reshard_after_forward ? 0 : 1, ahead = (u.prefetch ? 1 : 0) * (1 - kept);
  const double resident = kept * (u.before_last + u.resident), head = has_head ? u.head : 0;
  Zero3InB b;
  b.loss = u.held + head + resident + kept * u.last_block;
  b.head = b.loss + ahead * u.last_block;
  b.block = u.held + head + u.last_block + ahead * u.before_last + resident;
  return b;
}

Zero3Held zero3_held(const parallel::FullyShardedDataParallel& fsdp, bool has_embedding, bool has_head,
                     size_t first_layer, size_t end_layer) {
  Zero3Held z;
  z.on = true, z.prefetch = fsdp.options().prefetch, z.reshard_after_forward = fsdp.options().reshard_after_forward;
  const auto& units = fsdp.units();
  // [embedding, blocks, head], or a pipeline stage's (or an interleaved chunk's) part of them: the embedding
  // only on the first, the head only on the last (its last block is then the last layer). Prefetch stays
  // inside a chunk, so its first layer has none before it.
  const size_t n = std::min(end_layer, fsdp.num_layers()), f = first_layer;
  const size_t blocks = n - f - (has_head ? 1 : 0) - (has_embedding ? 1 : 0), last = n - (has_head ? 2 : 1);
  auto bytes = [&](size_t u) { return double(units[u].full.nbytes()); };
  // Read by a later layer (the head, the tied wte on one stage): gathered from its forward to that layer's backward.
  std::vector<bool> held(units.size(), false);
  for (size_t u = f; u < n; ++u)
    if (fsdp.read_by_a_later_layer(u)) held[u] = true, z.held += bytes(u);
  auto gathered = [&](size_t l) {
    double b = 0;
    for (size_t u : fsdp.layer_units(l)) b += held[u] ? 0 : bytes(u);
    return b;
  };
  // A unit's reduce-scatter: its flattened fp32 gradient [P] and the shard it reduces into [P / group].
  auto reduce = [&](size_t u) { return 4.0 * double(units[u].full.numel()) * (1 + 1.0 / units[u].group->size()); };
  const size_t own = fsdp.num_layers();  // the units past the layers' own (a tied wte copy, --ep's experts)
  if (has_embedding) z.first = gathered(f);
  // The one the chunk's backward launches last, left in flight by a deferred sync: its first layer's own unit
  // (a head's ln_f, whose gradient comes after the tied wte copy's; the embedding's chunk syncs last of all).
  if (!units[f].params.empty()) z.last_reduce = reduce(f);
  // Gathered from the chunk's forward to its backward (fully_sharded.cpp's after_forward): without reshard after
  // forward every layer's units; with it the rank's last layer's, whose backward was once the next thing to run.
  for (size_t l = f; l < n && !z.reshard_after_forward; ++l) z.between += gathered(l);
  if (z.reshard_after_forward && n == own && n > f) z.between = gathered(n - 1);
  if (has_head) {
    z.head = gathered(n - 1);
    if (!units[n - 1].params.empty()) z.head_reduce = reduce(n - 1);  // the head layer's own unit (ln_f)
    for (size_t u : fsdp.layer_units(n - 1))  // a last stage's tied wte copy: a unit of its own, after the layers'
      if (u >= own) z.head_own += bytes(u), z.head_own_reduce += reduce(u);
  }
  if (blocks == 0) return z;
  z.last_block = gathered(last);
  for (size_t u : fsdp.layer_units(last))
    if (u >= own) z.experts_reduce = reduce(u);  // --ep: the experts' own unit
  if (last >= f + 1) z.before_last = gathered(last - 1);  // a block, or the embedding
  for (size_t l = f; !z.reshard_after_forward && l + 2 <= last; ++l)  // gathered since their forward
    z.resident += gathered(l), z.resident_rerun += l + 3 <= last ? gathered(l) : 0;
  if (blocks < 2) return z;
  // --recompute full: the block before the last reruns beside the last block's reduce-scatter in flight.
  z.block_reduce = reduce(last), z.earlier_block = gathered(last - 1),
  z.before_earlier = last >= f + 2 ? gathered(last - 2) : 0;
  return z;
}

}  // namespace loom::optim
