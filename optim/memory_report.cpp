#include "optim/memory_report.h"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "autograd/variable.h"
#include "optim/distributed_optimizer.h"
#include "parallel/pipeline_parallel/interleaved_schedule.h"

namespace loom::optim {

namespace {

// The elements of dp's params in its main buffer: all but the experts kept apart (expert parallelism).
int64_t dense_elements(const parallel::DataParallelBucket& dp) {
  int64_t n = 0;
  for (const Tensor& p : dp.params()) n += dp.kept_apart(p) ? 0 : p.numel();
  return n;
}

}  // namespace

MemoryBreakdown measure_memory(const std::vector<Tensor>& params, const parallel::DataParallelBucket* dp,
                               const parallel::ZeroDataParallelBucket* zero, const MixedPrecisionOptimizer& opt,
                               int64_t peak_during_step, int64_t live_before_step) {
  MemoryBreakdown m;
  // Count each storage once: under --zero every param is a view of one buffer.
  std::unordered_set<const Storage*> seen;
  auto bytes_of = [&](const Tensor& t) -> int64_t {
    if (!t.defined() || !seen.insert(t.storage().get()).second) return 0;
    return int64_t(t.storage()->nbytes());
  };
  for (const Tensor& p : params) {
    m.num_params += p.numel();
    m.params += bytes_of(p);
  }
  const bool zero2 = zero && zero->reduce() == parallel::GradReduce::ShardGrads;
  if (zero2) {
    // ZeRO-2: the shards (their padding included) and the bucket-sized scratches.
    m.grads = bytes_of(zero->sharded_buckets().buffer());
    for (const Tensor& s : zero->sharded_buckets().scratches()) m.grads += bytes_of(s);
    const int64_t elements = dense_elements(*dp);
    const Tensor& buffer = opt.param_buffer();  // ZeRO's param buffer's padding
    m.comm = int64_t(buffer.storage()->nbytes()) - elements * int64_t(element_size(buffer.dtype()));
  } else if (dp) {
    m.grads = bytes_of(dp->bucket_manager().buffer());
    // What the buffer holds beyond its params' gradients: the buckets' padding.
    const int64_t elements = dense_elements(*dp);
    m.comm = m.grads - elements * 4;
    // ZeRO's param buffer, laid out alike: its padding too (undefined without ZeRO).
    if (const Tensor& buffer = opt.param_buffer(); buffer.defined())
      m.comm += int64_t(buffer.storage()->nbytes()) - elements * int64_t(element_size(buffer.dtype()));
  } else {
    for (const Tensor& p : params) m.grads += bytes_of(autograd::grad(p));
  }
  if (dp) {  // expert parallelism: the experts' own buffers, over their expert-dp group (data_parallel_bucket.h)
    int64_t elements = 0;
    const Tensor* expert = nullptr;  // any of them: under ZeRO a view of the experts' param buffer
    for (const Tensor& p : dp->params())
      if (dp->kept_apart(p)) elements += p.numel(), expert = expert ? expert : &p;
    const parallel::ShardedBuckets* shards = zero ? zero->expert_shards() : nullptr;  // ZeRO-1/2
    if (expert && shards && zero2) {
      m.grads += bytes_of(shards->buffer());  // ZeRO-2: their shards (padding included) and scratches
      for (const Tensor& s : shards->scratches()) m.grads += bytes_of(s);
    } else if (expert) {
      const int64_t buffer = bytes_of(dp->main_grad(*expert));  // the whole fp32 buffer
      m.grads += buffer;
      m.comm += buffer - 4 * elements;  // its buckets' padding
    }
    if (expert && opt.param_buffer().defined())  // ZeRO: the experts' param buffer's padding
      m.comm += int64_t(expert->storage()->nbytes()) - elements * int64_t(element_size(expert->dtype()));
  }
  for (size_t i = 0; i < opt.main_params().size(); ++i) {
    m.optimizer += bytes_of(opt.main_params()[i].main);  // 0 when it is (a view of) the param
    const AdamWState& st = opt.adam_state(i);
    m.optimizer += bytes_of(st.exp_avg) + bytes_of(st.exp_avg_sq) + bytes_of(st.step);
  }
  m.activations_peak = peak_during_step - live_before_step;
  m.live = memory_stats(params.empty() ? kCPU : params.front().device()).live_bytes;  // the model's device
  return m;
}

MemoryPrediction predict_memory(int64_t num_params, DType dtype, int dp, int zero) {
  const int64_t param_bytes = int64_t(element_size(dtype));
  const int64_t main_bytes = dtype == kFloat32 ? 0 : 4;  // fp32 main params alias fp32 params
  const double opt_per_param = double(main_bytes + 8) / double(zero >= 1 ? dp : 1);
  const double grad_per_param = 4.0 / double(zero >= 2 ? dp : 1);
  const double params_per_rank = double(num_params) / double(zero >= 3 ? dp : 1);  // ZeRO-3: the shards
  return {int64_t(params_per_rank * double(param_bytes)), int64_t(double(num_params) * grad_per_param),
          int64_t(double(num_params) * opt_per_param)};
}

MemoryPrediction predict_memory_moe(int64_t dense_params, int64_t expert_params, DType dtype, int dp, int ep,
                                    int zero) {
  LOOM_CHECK(ep >= 1 && dp % ep == 0, "predict_memory_moe: ep ", ep, " must divide dp ", dp);
  const MemoryPrediction d = predict_memory(dense_params, dtype, dp, zero);
  const MemoryPrediction x = predict_memory(expert_params, dtype, dp / ep, zero);
  return {d.params + x.params, d.grads + x.grads, d.optimizer + x.optimizer};
}

std::vector<int64_t> predict_bucket_numels(const std::vector<int64_t>& numels, double cap_mb, int dp) {
  const int64_t cap = std::max<int64_t>(1, int64_t(cap_mb * 1024 * 1024 / 4)), pad_to = int64_t(dp) * 64;
  std::vector<int64_t> buckets;
  int64_t used = 0;
  auto close = [&] { buckets.push_back((used + pad_to - 1) / pad_to * pad_to); };
  for (auto it = numels.rbegin(); it != numels.rend(); ++it) {
    if (used > 0 && used + *it > cap) close(), used = 0;
    used += *it;
  }
  if (used > 0) close();
  return buckets;
}

int64_t predict_bucket_padding(const std::vector<int64_t>& numels, double cap_mb, int dp) {
  int64_t pad = 0;
  for (int64_t n : predict_bucket_numels(numels, cap_mb, dp)) pad += n;
  for (int64_t n : numels) pad -= n;
  return pad;
}

int64_t predict_zero2_grad_bytes(const std::vector<int64_t>& numels, double cap_mb, int dp) {
  const std::vector<int64_t> buckets = predict_bucket_numels(numels, cap_mb, dp);
  int64_t shards = 0, largest = 0;
  for (int64_t n : buckets) shards += n / dp, largest = std::max(largest, n);
  return 4 * (shards + largest * std::min<int64_t>(2, int64_t(buckets.size())));
}

int64_t predict_comm_bytes(const BucketedParams& b, DType dtype, int zero) {
  const int64_t pad = predict_bucket_padding(b.dense, b.cap_mb, b.dp) +
                      predict_bucket_padding(b.experts, b.cap_mb, b.expert_dp);
  // fp32 grad buffers (under ZeRO-2 in the grads row); under ZeRO also the param buffers, in the model's dtype
  return pad * ((zero >= 2 ? 0 : 4) + (zero >= 1 ? int64_t(element_size(dtype)) : 0));
}

int64_t predict_zero2_grad_bytes(const BucketedParams& b) {
  return predict_zero2_grad_bytes(b.dense, b.cap_mb, b.dp) +
         (b.experts.empty() ? 0 : predict_zero2_grad_bytes(b.experts, b.cap_mb, b.expert_dp));
}

MemoryBreakdown measure_memory_fully_sharded(const parallel::FullyShardedDataParallel& fsdp,
                                             const MixedPrecisionOptimizer& opt, int64_t peak_during_step,
                                             int64_t live_before_step) {
  MemoryBreakdown m;
  for (const auto& unit : fsdp.units()) {
    if (unit.params.empty()) continue;
    m.num_params += unit.numel;
    m.params += int64_t(unit.shard.storage()->nbytes());
    m.grads += int64_t(unit.grad_shard.storage()->nbytes());
  }
  for (size_t i = 0; i < opt.main_params().size(); ++i) {
    const MainParam& mp = opt.main_params()[i];
    if (mp.main.dtype() != mp.model_param.dtype()) m.optimizer += int64_t(mp.main.nbytes());  // fp32: the shard itself
    const AdamWState& st = opt.adam_state(i);
    m.optimizer += int64_t(st.exp_avg.nbytes() + st.exp_avg_sq.nbytes() + st.step.nbytes());
  }
  m.comm = fsdp.peak_gathered_bytes();
  m.activations_peak = peak_during_step - live_before_step;
  m.live = memory_stats(fsdp.units().front().shard.device()).live_bytes;
  return m;
}

int64_t zero3_gathered_elements(const Zero3Units& u) {
  const size_t n = u.numel.size();
  auto same_chunk = [&](size_t a, size_t b) { return u.chunk.empty() || u.chunk[a] == u.chunk[b]; };
  auto beside_held = [&](size_t l) {
    return u.beside_held.empty() || u.beside_held[u.chunk.empty() ? 0 : size_t(u.chunk[l])];
  };
  int64_t all = 0;
  for (int64_t p : u.numel) all += p;
  // Every unit gathered until its backward; or (zero bubble) until its W, which the stage's first one runs after
  // the last B has gathered them all.
  if (!u.reshard_after_forward || u.split_backward || n == 0) return all;
  // Held through the step, then two adjacent units of the others (one computing, the next prefetched):
  // any two while the last unit is not held; beside it, those of the chunks that run while it waits.
  const size_t first = u.first_held ? 1 : 0;
  const bool last_held = u.last_held && n > first + 1;
  auto pair = [&](size_t l, size_t end) {
    return u.numel[l] + (u.prefetch && l + 1 < end && same_chunk(l, l + 1) ? u.numel[l + 1] : 0);
  };
  int64_t apart = 0, beside = 0;
  for (size_t l = first; l < n; ++l) apart = std::max(apart, pair(l, n));
  for (size_t l = first; last_held && l + 1 < n; ++l)
    if (beside_held(l)) beside = std::max(beside, pair(l, n - 1));
  return (first ? u.numel.front() : 0) + std::max(apart, last_held ? u.numel.back() + beside : 0);
}

std::vector<bool> zero3_chunks_beside_held(int pp, int pp_rank, int v, int micro_batches) {
  std::vector<bool> beside(size_t(v), false);
  bool held = false;  // the last chunk's last unit, gathered since its forward
  for (const parallel::ScheduledOp& op : parallel::interleaved_order(pp, pp_rank, v, micro_batches)) {
    const bool last = op.chunk == v - 1;
    if (last && op.kind == 'B') held = false;  // its own backward computes it first, then reshards it
    if (held) beside[size_t(op.chunk)] = true;
    if (last && op.kind == 'F') held = true;  // the rank's last layer: not resharded after forward
  }
  return beside;
}

MemoryPrediction predict_memory_fully_sharded(const parallel::FullyShardedDataParallel& fsdp, DType dtype,
                                              const std::vector<bool>& beside_held, bool split_backward) {
  const int64_t b = int64_t(element_size(dtype));
  // P_u, over the unit's own group: dp (x cp), or for --ep's experts their expert-dp group.
  auto group = [&](size_t k) { return int64_t(fsdp.units()[k].group ? fsdp.units()[k].group->size() : 1); };
  auto padded = [&](size_t k) { return (fsdp.units()[k].numel + group(k) - 1) / group(k) * group(k); };
  int64_t shard = 0;
  double owned = 0;  // the elements whose main param and moments this rank keeps
  for (size_t k = 0; k < fsdp.units().size(); ++k)
    shard += padded(k) / group(k), owned += double(fsdp.units()[k].numel) / double(group(k));
  // The working set by layer: a layer's own unit, with the own units (the
  // pipeline's tied wte, --ep's experts) that it alone reads, gathered and freed together.
  Zero3Units u;
  for (size_t l = 0; l < fsdp.num_layers(); ++l) {
    int64_t n = padded(l);
    for (size_t k : fsdp.layer_units(l))
      if (k >= fsdp.num_layers()) n += padded(k);
    u.numel.push_back(n);
    u.chunk.push_back(int(fsdp.chunk_of(l)));
  }
  u.first_held = fsdp.read_by_a_later_layer(0), u.beside_held = beside_held;
  u.last_held = std::find(beside_held.begin(), beside_held.end(), true) != beside_held.end();
  u.prefetch = fsdp.options().prefetch, u.reshard_after_forward = fsdp.options().reshard_after_forward;
  u.split_backward = split_backward;
  const int64_t main_bytes = dtype == kFloat32 ? 0 : 4;
  MemoryPrediction p{shard * b, shard * 4, int64_t(owned * double(main_bytes + 8))};
  p.comm = zero3_gathered_elements(u) * b;
  return p;
}

std::string memory_report(const MemoryBreakdown& mine, const MemoryPrediction& predicted,
                          parallel::ProcessGroup& world, std::string* json) {
  constexpr int kFields = 12;
  Tensor row = from_vector(std::vector<int64_t>{mine.num_params, mine.params, predicted.params, mine.grads,
                                                predicted.grads, mine.optimizer, predicted.optimizer, mine.comm,
                                                predicted.comm, mine.activations_peak, predicted.activations,
                                                mine.live});
  Tensor all = zeros({int64_t(world.size()) * kFields}, kInt64);
  world.all_gather(all, row);
  if (world.rank() != 0) return "";
  std::vector<int64_t> v = all.to_vector<int64_t>();
  auto mib = [](int64_t b) { return double(b) / (1024.0 * 1024.0); };
  std::string out = "memory after step 1 (MiB, measured / predicted):\n"
                    " rank     params   |  params         | grads (main_grad) | optimizer state   | bytes/param   |"
                    " comm buffers    | activ. peak       | live\n";
  char line[256];
  for (int r = 0; r < world.size(); ++r) {
    const int64_t* f = v.data() + size_t(r) * kFields;
    // params + grads + optimizer state per parameter: Megatron's 6 + 12/dp for bf16 + ZeRO
    const double n = double(std::max<int64_t>(f[0], 1));
    std::snprintf(line, sizeof line,
                  " %4d %10lld   | %6.2f / %6.2f | %7.2f / %7.2f | %7.2f / %7.2f | %5.2f / %5.2f | %6.3f / %6.3f "
                  "| %7.2f / %7.2f | %7.2f\n",
                  r, (long long)f[0], mib(f[1]), mib(f[2]), mib(f[3]), mib(f[4]), mib(f[5]), mib(f[6]),
                  double(f[1] + f[3] + f[5]) / n, double(f[2] + f[4] + f[6]) / n, mib(f[7]), mib(f[8]), mib(f[9]),
                  mib(f[10]), mib(f[11]));
    out += line;
  }
  out += " comm buffers: the buckets' padding (grads are reduced, ZeRO's params gathered, in place);"
         " activ. peak: optim/activation_memory.h\n";
  if (json) {
    auto pair = [](const char* key, int64_t measured, int64_t predicted) {
      return str("\"", key, "\": {\"measured\": ", measured, ", \"predicted\": ", predicted, "}");
    };
    *json = "{\"ranks\": [";
    for (int r = 0; r < world.size(); ++r) {
      const int64_t* f = v.data() + size_t(r) * kFields;
      *json += str(r == 0 ? "\n" : ",\n", "  {\"rank\": ", r, ", \"num_params\": ", f[0], ", ", pair("params", f[1], f[2]),
                   ", ", pair("grads", f[3], f[4]), ", ", pair("optimizer", f[5], f[6]), ", ",
                   pair("comm", f[7], f[8]), ", ", pair("activations", f[9], f[10]), ", \"live\": ", f[11], "}");
    }
    *json += "\n]}\n";
  }
  return out;
}

}  // namespace loom::optim
