#include "parallel/data_parallel/fully_sharded.h"

#include <algorithm>
#include <unordered_map>

#include "autograd/accumulate_grad.h"
#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/variable.h"
#include "parallel/teach/teach_break.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

namespace loom::parallel {

using Pass = FullyShardedObserver::Pass;
using Collective = FullyShardedObserver::Collective;

FullyShardedDataParallel::FullyShardedDataParallel(const std::vector<std::shared_ptr<nn::Layer>>& layers,
                                                   ProcessGroup& dp_group, FullyShardedOptions options)
    : dp_group_(dp_group), options_(options), layer_units_(layers.size()),
      observer_(options.observer ? options.observer : std::make_shared<FullyShardedObserver>()) {
  NoGradGuard no_grad;
  for (size_t c = 0; c < options_.chunk_sizes.size(); ++c) chunk_of_.insert(chunk_of_.end(), options_.chunk_sizes[c], c);
  LOOM_CHECK(options_.chunk_sizes.empty() || chunk_of_.size() == layers.size(), "FullyShardedDataParallel: the chunks "
             "hold ", chunk_of_.size(), " layers, the model ", layers.size());
  chunk_of_.resize(layers.size(), 0);
  std::vector<Tensor> all, experts;
  for (const auto& layer : layers)
    for (const Tensor& p : layer->parameters()) (options_.experts.holds(p) ? experts : all).push_back(p);
  // Every replica starts from dp rank 0's weights (HSDP: the replicas' first, then the shard group's);
  // the experts from their group's rank 0 (the ep ranks hold different ones; HSDP: the replicas' first too).
  if (options_.replicate_group) {
    broadcast_params(unique_params(all), *options_.replicate_group);
    broadcast_params(unique_params(experts), *options_.replicate_group);
  }
  broadcast_params(unique_params(all), dp_group_);
  if (options_.experts.group) broadcast_params(unique_params(experts), *options_.experts.group);

  // 1. Units: layer l owns the params it is the first to hold; it reads those
  //    and any earlier unit's it shares (the head: the embedding unit's wte).
  //    An own unit's param is owned by its unit, after the layers'; a layer's
  //    experts by their unit, after those (over the experts' group).
  std::unordered_map<const TensorImpl*, size_t> owner;
  for (size_t k = 0; k < options_.own_units.size(); ++k) owner.emplace(options_.own_units[k].impl(), layers.size() + k);
  units_.resize(layers.size() + options_.own_units.size());
  for (Unit& unit : units_) unit.group = &dp_group_;
  for (const auto& layer : layers) {  // the layer's experts, if any: one unit, over their group
    bool any = false;
    for (const Tensor& p : layer->parameters())
      if (options_.experts.holds(p)) any |= owner.emplace(p.impl(), units_.size()).second;
    if (!any) continue;
    units_.push_back(Unit{});
    units_.back().group = options_.experts.group;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const Tensor& p : layers[l]->parameters()) {
      auto [it, fresh] = owner.emplace(p.impl(), l);
      Unit& unit = units_[it->second];
      if (fresh || (it->second >= layers.size() && (unit.params.empty() || options_.experts.holds(p)))) {
        LOOM_CHECK(autograd::requires_grad(p), "FullyShardedDataParallel: ", p.describe(), " does not require grad");
        LOOM_CHECK(unit.params.empty() || p.dtype() == unit.params[0].dtype(), "FullyShardedDataParallel: layer ", l,
                   " has params of mixed dtypes (", unit.params[0].describe(), ", ", p.describe(), ")");
        unit.params.push_back(p);
        unit.offsets.push_back(unit.numel);
        unit.numel += p.numel();
      }
      std::vector<size_t>& reads = layer_units_[l];
      if (std::find(reads.begin(), reads.end(), it->second) == reads.end()) reads.push_back(it->second);
    }
  }
  for (size_t k = 0; k < options_.own_units.size(); ++k)
    LOOM_CHECK(!units_[layers.size() + k].params.empty(), "FullyShardedDataParallel: own unit ", k, " (",
               options_.own_units[k].describe(), ") is a param of none of the ", layers.size(), " layers");

  // 2. Flatten each unit into `full` (params become views of it), keep this
  //    rank's shard, free `full`.
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (unit.params.empty()) continue;
    const Tensor& first = unit.params[0];
    const int64_t dp = unit.group->size();
    const int64_t padded = (unit.numel + dp - 1) / dp * dp, shard = padded / dp;
    unit.full = zeros({padded}, first.dtype(), first.device());
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const Tensor& p = unit.params[i];
      Tensor slot = ops::narrow(unit.full, 0, unit.offsets[i], p.numel());
      ops::copy_(slot, ops::reshape(autograd::detach(p), {p.numel()}));
      ops::set_data(p, ops::view(slot, p.shape()));
    }
    unit.shard = ops::clone(ops::narrow(unit.full, 0, unit.group->rank() * shard, shard));
    unit.grad_shard = zeros({shard}, kFloat32, first.device());
    unit.full.storage()->release();
  }

  // 3. The hooks (hooks_ owns them: they go with this wrapper).
  for (size_t l = 0; l < layers.size(); ++l) {
    hooks_.push_back(layers[l]->register_forward_pre_hook([this, l](nn::Module&, const Tensor&) { before_forward(l); }));
    hooks_.push_back(layers[l]->register_forward_hook(
        [this, l](nn::Module&, const Tensor&, Tensor& out) { after_forward(l, out); }));
  }
  for (size_t u = 0; u < units_.size(); ++u)
    for (const Tensor& p : units_[u].params)
      hooks_.push_back(autograd::register_post_accumulate_grad_hook(p, [this, u](Tensor&) { on_grad_accumulated(u); }));
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  // The communication thread must not write into freed buffers.
  for (Unit& unit : units_)
    if (unit.gather) unit.gather->wait();
  if (in_flight_.work) in_flight_.work->wait();
}

// ---- forward ------------------------------------------------------------------------------

void FullyShardedDataParallel::before_forward(size_t layer) {
  for (size_t u : layer_units_[layer]) unshard(u);
  observer_->layer_begins(layer, Pass::kForward);
  // While this layer computes, the dp group's thread gathers the next one's params.
  if (options_.prefetch && layer + 1 < layer_units_.size() && chunk_of_[layer] == chunk_of_[layer + 1])
    for (size_t u : layer_units_[layer + 1]) prefetch(u);
}

void FullyShardedDataParallel::after_forward(size_t layer, Tensor& output) {
  observer_->layer_ends(layer, Pass::kForward);
  const bool backward_follows = GradMode::is_enabled();
  // The last layer keeps its params: its backward is the next thing to run
  // (torchtitan's reshard_after_forward=False for the last block).
  const bool keep = backward_follows && (!options_.reshard_after_forward || layer + 1 == layer_units_.size());
  if (!keep)
    for (size_t u : layer_units_[layer]) reshard(u);
  // loom has no module backward pre-hook (PyTorch FSDP registers one on the
  // output's grad_fn). An identity on the output does the same: every node of
  // this layer's backward waits for the gradient it passes on, so its
  // backward runs first - and gathers the params those nodes will read.
  if (backward_follows)
    output = autograd::record("UnshardBeforeBackward", {&output}, output, [this, layer](const autograd::TensorList& g) {
      before_backward(layer);
      return g;
    });
}

// ---- backward -----------------------------------------------------------------------------

void FullyShardedDataParallel::before_backward(size_t layer) {
  if (teach::broken(teach::Break::Zero3FreeBeforeBackward)) return;  // --teach-break zero3-free-before-backward: backward reads freed params
  for (size_t u : layer_units_[layer]) unshard(u);
  observer_->layer_begins(layer, Pass::kBackward);
  if (options_.prefetch && layer > 0 && chunk_of_[layer - 1] == chunk_of_[layer])
    for (size_t u : layer_units_[layer - 1]) prefetch(u);  // backward goes the other way
}

void FullyShardedDataParallel::on_grad_accumulated(size_t u) {
  if (!callback_queued_ && finish_sync_in_backward_) {  // after this backward: wait for the last reduce-scatter
    autograd::Engine::queue_callback([this] { finish_grad_sync(); });
    callback_queued_ = true;
  }
  // The unit's last gradient: no node of this backward reads its params again.
  if (++units_[u].grads_ready == units_[u].params.size()) reduce_scatter_grad(u);
}

void FullyShardedDataParallel::reduce_scatter_grad(size_t u) {
  observer_->layer_ends(u, Pass::kBackward);  // unit u is layer u's
  finish_reduce_scatter();  // one unit's full gradient in flight at a time
  NoGradGuard no_grad;
  Unit& unit = units_[u];
  // The unit's gradient flattened like its params, in fp32 (FSDP's reduce_dtype):
  // [padded], the padding zero.
  Tensor full_grad = zeros({unit.full.numel()}, kFloat32, unit.full.device());
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const Tensor& p = unit.params[i];
    Tensor g = autograd::grad(p);
    if (g.defined()) ops::copy_(ops::narrow(full_grad, 0, unit.offsets[i], p.numel()), ops::reshape(g, {p.numel()}));
    autograd::set_grad(p, Tensor());  // the full gradient goes
  }
  sum_tp_partial_grads(unit, full_grad);  // sequence parallelism: the layernorms' partial sums, over tp first
  // The experts' average over expert-dp (HSDP: over their shard group here, its replicas after), times
  // 1 / ep: (1 / dp) x the sum over every rank's tokens.
  if (unit.group != &dp_group_) ops::mul_(full_grad, options_.experts.grad_scale);
  Tensor grad_out = empty(unit.grad_shard.shape(), kFloat32, unit.grad_shard.device());
  const auto scope = observer_->launching(u);  // the collective below is for unit u
  in_flight_ = {unit.group->reduce_scatter_async(grad_out, full_grad, ReduceOp::Avg), full_grad, grad_out, u};
  reshard(u);
}

// Sequence parallelism: each tp rank's layernorm gradients are partial sums;
// the whole one is their sum over tp, taken before the dp reduce-scatter cuts
// it: one all-reduce per unit, of those params' slots flattened together, and
// synchronous (a block's layernorms are 4C elements).
void FullyShardedDataParallel::sum_tp_partial_grads(const Unit& unit, const Tensor& full_grad) {
  if (options_.tp_partial_grads.empty()) return;  // no sequence parallelism
  std::vector<Tensor> slots;  // the partial params' slots of full_grad, in unit order
  for (size_t i = 0; i < unit.params.size(); ++i)
    for (const Tensor& p : options_.tp_partial_grads)
      if (p.impl() == unit.params[i].impl()) slots.push_back(ops::narrow(full_grad, 0, unit.offsets[i], p.numel()));
  all_reduce_coalesced(slots, *options_.tp_group);
}

void FullyShardedDataParallel::finish_reduce_scatter() {
  if (!in_flight_.work) return;
  {
    const auto scope = observer_->waiting(in_flight_.unit, Collective::kGradReduceScatter);
    in_flight_.work->wait();
  }
  // HSDP: this shard's average over the shard group, averaged over its replicas = the dp average.
  if (options_.replicate_group) options_.replicate_group->all_reduce(in_flight_.grad_out, ReduceOp::Avg);
  ops::add_(units_[in_flight_.unit].grad_shard, in_flight_.grad_out);  // micro-batches add up in the shard
  in_flight_ = {};
}

void FullyShardedDataParallel::finish_grad_sync() {
  callback_queued_ = false;
  // A unit some of whose params got no gradient this backward: the rest still count. An experts'
  // unit reduces even if none of its experts got a token here: its group's other ranks may have.
  bool backward_ran = false;
  for (const Unit& unit : units_) backward_ran |= unit.grads_ready > 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const bool experts = unit.group != &dp_group_ && backward_ran;
    if ((unit.grads_ready > 0 || experts) && unit.grads_ready < unit.params.size()) reduce_scatter_grad(u);
  }
  finish_reduce_scatter();
  for (Unit& unit : units_) unit.grads_ready = 0;
}

void FullyShardedDataParallel::zero_grad() {
  for (Unit& unit : units_) {
    if (unit.grad_shard.defined()) ops::zero_(unit.grad_shard);
    autograd::zero_grad(unit.params, /*set_to_none=*/true);
  }
}

// ---- unshard / reshard --------------------------------------------------------------------

void FullyShardedDataParallel::prefetch(size_t u) {
  Unit& unit = units_[u];
  if (unit.gathered || unit.gather) return;
  unit.full.storage()->allocate();
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes());
  const auto scope = observer_->launching(u);  // the collective below is for unit u
  unit.gather = unit.group->all_gather_async(unit.full, unit.shard);  // every rank's shard -> the whole unit
}

void FullyShardedDataParallel::unshard(size_t u) {
  Unit& unit = units_[u];
  if (unit.gathered) return;
  prefetch(u);  // a no-op when it was prefetched
  const auto scope = observer_->waiting(u, Collective::kParamAllGather);  // the exposed part of the gather
  unit.gather->wait();
  unit.gather = nullptr;
  unit.gathered = true;
}

void FullyShardedDataParallel::reshard(size_t u) {
  Unit& unit = units_[u];
  if (unit.gather) unit.gather->wait();  // never free a buffer the comm thread is writing
  unit.gather = nullptr;
  unit.full.storage()->release();
  unit.gathered = false;
}

void FullyShardedDataParallel::unshard_all() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].params.empty()) prefetch(u);
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].params.empty()) unshard(u);
}

void FullyShardedDataParallel::reshard_all() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].params.empty()) reshard(u);
}

Tensor FullyShardedDataParallel::grad_shard_of(const Tensor& param) const {
  for (size_t k = 0; k < options_.own_units.size(); ++k)
    if (options_.own_units[k].impl() == param.impl()) return units_[layer_units_.size() + k].grad_shard;
  return Tensor();
}

bool FullyShardedDataParallel::read_by_a_later_layer(size_t u) const {
  for (size_t l = u + 1; l < layer_units_.size(); ++l)
    if (std::find(layer_units_[l].begin(), layer_units_[l].end(), u) != layer_units_[l].end()) return true;
  return false;
}

int64_t FullyShardedDataParallel::gathered_bytes() const {
  int64_t bytes = 0;
  for (const Unit& unit : units_)
    if (unit.full.defined() && unit.full.storage()->is_allocated()) bytes += int64_t(unit.full.nbytes());
  return bytes;
}

}  // namespace loom::parallel
