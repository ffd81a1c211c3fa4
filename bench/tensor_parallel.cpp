// bench_tensor_parallel: what splitting each matmul over tp ranks costs and
// saves, measured on one micro-batch of a GPT and printed beside the formula.
//
// For tp = 1, 2, 4 (those that divide the world and the heads; the world is
// cut into groups of tp consecutive ranks) and with / without sequence
// parallelism, every rank builds the whole GPT's tp shards (one stage, pp = 1)
// and runs forward + backward once to warm up, then once measured:
//   params per rank   counted, beside (V_pad C + L (12 C^2 + 7 C)) / tp
//                     + (T C + 2 C + L 6 C): the split weights and the
//                     replicated ones (wpe, ln_f, per block 2 layernorms and
//                     2 row-parallel biases)
//   activations       the allocator's peak during forward + backward above what
//                     was live before, and its ratio to tp = 1's, beside the
//                     ratio Megatron's activation formula gives
//                     (Korthikanti et al. 2022, per layer, bytes / (s b h)):
//                     no tp 34 + 5as/h; tp 10 + 24/t + 5as/(ht); tp + SP
//                     34/t + 5as/(ht). loom keeps fp32 activations and no
//                     dropout masks, so its constants differ; the trend is the lesson.
//   communication     every collective on the tp group, counted by a wrapper
//                     around it, in forward and in backward: how many, and
//                     the bytes of the tensors they carry (the payload, not
//                     the 2 (t-1)/t of it a ring all-reduce sends). Megatron's
//                     count per transformer layer: 2 all-reduces of [b, s, h]
//                     in forward and 2 in backward (with SP: 2 all-gathers +
//                     2 reduce-scatters each way, the same bytes). Around the
//                     layers: the vocab-parallel embedding's all-reduce
//                     (forward), the head's f (backward) and the
//                     cross-entropy's 3 all-reduces of b s floats (forward).
//   ms                forward + backward of that micro-batch; the ranks share
//                     this machine's cores, so no speed-up is expected on a laptop.
// To see the collectives inside forward and backward on a timeline:
//   mpirun -np 2 build/examples/train_gpt --tp 2 --steps 3 --trace tp.json
//
// Usage: mpirun -np 4 build/bench/bench_tensor_parallel [--layers 4] [--embd 128] [--heads 4]
//        [--block 64] [--batch 8] [--vocab 65]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "autograd/engine.h"
#include "parallel/comm/distributed.h"
#include "parallel/comm/process_group_decorator.h"
#include "parallel/model_chunks.h"
#include "parallel/tensor_parallel/sharding.h"
#include "parallel/tensor_parallel/gpt.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;

namespace {

// A ProcessGroup that counts what passes through it, then hands it on.
class CountingGroup : public ProcessGroupDecorator {
 public:
  struct Count {
    int64_t ops = 0, bytes = 0;
  };
  struct Counts {
    Count all_reduce, all_gather, reduce_scatter, other;
  };
  Counts n;

  explicit CountingGroup(ProcessGroup& inner) : ProcessGroupDecorator(inner) {}
  std::shared_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    add(n.all_reduce, t);
    return inner_.all_reduce_async(t, op);
  }
  std::shared_ptr<Work> reduce_scatter_async(const Tensor& out, const Tensor& in, ReduceOp op) override {
    add(n.reduce_scatter, in);
    return inner_.reduce_scatter_async(out, in, op);
  }
  std::shared_ptr<Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    add(n.all_gather, out);
    return inner_.all_gather_async(out, in);
  }
  std::shared_ptr<Work> broadcast_async(const Tensor& t, int root) override {
    add(n.other, t);
    return inner_.broadcast_async(t, root);
  }
  std::shared_ptr<Work> send_async(const Tensor& t, int dst, int tag) override {
    add(n.other, t);
    return inner_.send_async(t, dst, tag);
  }
  std::shared_ptr<Work> recv_async(const Tensor& t, int src, int tag) override {
    add(n.other, t);
    return inner_.recv_async(t, src, tag);
  }

 private:
  static void add(Count& c, const Tensor& t) {
    ++c.ops;
    c.bytes += int64_t(t.nbytes());
  }
};

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

// What ran between two snapshots of the counts.
CountingGroup::Counts since(const CountingGroup::Counts& now, const CountingGroup::Counts& before) {
  CountingGroup::Counts d;
  auto sub = [](CountingGroup::Count a, CountingGroup::Count b) { return CountingGroup::Count{a.ops - b.ops, a.bytes - b.bytes}; };
  d.all_reduce = sub(now.all_reduce, before.all_reduce);
  d.all_gather = sub(now.all_gather, before.all_gather);
  d.reduce_scatter = sub(now.reduce_scatter, before.reduce_scatter);
  d.other = sub(now.other, before.other);
  return d;
}

std::string describe(const CountingGroup::Counts& g) {
  char buf[200];
  // KiB and MiB throughout, as train_gpt's --memory-report and --trace give them.
  std::snprintf(buf, sizeof buf, "%2lld all-reduce %7.1f KiB, %2lld all-gather %7.1f KiB, %2lld reduce-scatter %7.1f KiB",
                (long long)g.all_reduce.ops, g.all_reduce.bytes / 1024.0, (long long)g.all_gather.ops,
                g.all_gather.bytes / 1024.0, (long long)g.reduce_scatter.ops, g.reduce_scatter.bytes / 1024.0);
  return buf;
}

// The collectives Megatron's design implies for one micro-batch: per layer
// 2 all-reduces of [b, s, h] each way (SP: 2 all-gathers + 2 reduce-scatters
// each way); the embedding's g (forward: all-reduce; SP adds the scatter's
// all-gather in backward), the head's f (backward all-reduce; SP: all-gather
// forward, reduce-scatter backward), the cross-entropy's 3 all-reduces of b s floats.
std::pair<CountingGroup::Counts, CountingGroup::Counts> expected(int64_t L, bool sp, int64_t bsh, int64_t bs) {
  using C = CountingGroup::Count;
  CountingGroup::Counts f, b;
  if (!sp) {
    f.all_reduce = C{2 * L + 1 + 3, (2 * L + 1) * bsh + 3 * bs};
    b.all_reduce = C{2 * L + 1, (2 * L + 1) * bsh};
  } else {
    f.all_reduce = C{1 + 3, bsh + 3 * bs};
    f.all_gather = C{2 * L + 1, (2 * L + 1) * bsh};
    f.reduce_scatter = C{2 * L, 2 * L * bsh};
    b.all_gather = C{2 * L + 1, (2 * L + 1) * bsh};
    b.reduce_scatter = C{2 * L + 1, (2 * L + 1) * bsh};
  }
  return {f, b};
}

bool same(const CountingGroup::Counts& a, const CountingGroup::Counts& b) {
  auto eq = [](CountingGroup::Count x, CountingGroup::Count y) { return x.ops == y.ops && x.bytes == y.bytes; };
  return eq(a.all_reduce, b.all_reduce) && eq(a.all_gather, b.all_gather) && eq(a.reduce_scatter, b.reduce_scatter);
}

// Megatron's activation bytes per layer over s b h, as a function of t and SP.
double megatron_activations(double t, bool sp, double a, double s, double h) {
  if (t == 1) return 34 + 5 * a * s / h;
  return (sp ? 34 / t : 10 + 24 / t) + 5 * a * s / (h * t);
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv, [&] {
    ProcessGroup& world = parallel::world();
    const int64_t L = flag(argc, argv, "--layers", 4), C = flag(argc, argv, "--embd", 128),
                  H = flag(argc, argv, "--heads", 4), T = flag(argc, argv, "--block", 64),
                  B = flag(argc, argv, "--batch", 8), V = flag(argc, argv, "--vocab", 65);
    nn::GPTConfig cfg{V, T, L, H, C, 0.0, 1337};
    Generator gen(7);
    const Tensor x = randint(0, V, {B, T}, gen, kInt64), y = randint(0, V, {B, T}, gen, kInt64);
    const bool rank0 = world.rank() == 0;
    if (rank0)
      std::printf("GPT %lld layers, %lld embd, %lld heads, block %lld, vocab %lld; micro-batch %lld; %d ranks\n\n",
                  (long long)L, (long long)C, (long long)H, (long long)T, (long long)V, (long long)B, world.size());
    double activations_tp1 = 0;
    for (int tp : {1, 2, 4}) {
      if (world.size() % tp != 0 || H % tp != 0) continue;
      std::unique_ptr<ProcessGroup> group = world.split(world.rank() / tp, world.rank(), "tp");
      CountingGroup counted(*group);
      for (bool sp : {false, true}) {
        if (sp && (tp == 1 || T % tp != 0)) continue;
        // As parallel::build_model builds it: every layer, each its tp shard when tp > 1.
        std::unique_ptr<TensorParallelSharding> sharding;
        LayerBuilder layers;
        if (tp > 1) {
          sharding = std::make_unique<TensorParallelSharding>(cfg, counted, sp);
          layers = sharding->layer_builder();
        }
        ModelChunks stage(cfg, LayerRange{0, cfg.num_layers()}, layers);
        // One forward + backward; returns the counts of its forward and of its backward.
        auto step = [&] {
          const CountingGroup::Counts start = counted.n;
          Tensor loss = stage.loss(stage.forward(x), y);  // the cross-entropy's all-reduces are forward's
          const CountingGroup::Counts after_forward = counted.n;
          autograd::backward(loss);
          return std::make_pair(since(after_forward, start), since(counted.n, after_forward));
        };
        step();  // warm-up: .grad allocated, nothing measured
        const int64_t live_before = memory_stats().live_bytes;
        reset_peak_memory_stats();
        const auto t0 = std::chrono::steady_clock::now();
        const auto [fwd, bwd] = step();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const double peak = double(memory_stats().peak_bytes - live_before);
        if (tp == 1) activations_tp1 = peak;

        const int64_t v_pad = padded_vocab_size(V, tp);
        const int64_t formula = (v_pad * C + L * (12 * C * C + 7 * C)) / tp + (T * C + 2 * C + L * 6 * C);
        const double bsh_kib = double(B * T * C) * 4 / 1024.0;
        if (!rank0) continue;
        std::printf("tp %d%s\n", tp, sp ? " + sequence parallel" : "");
        std::printf("  params/rank   %9lld   formula %9lld   ratio %.3f\n", (long long)stage.num_parameters(),
                    (long long)formula, double(stage.num_parameters()) / double(formula));
        std::printf("  activations   %9.2f MiB peak   vs tp 1: %.3f   Megatron's formula: %.3f\n", peak / 1048576.0,
                    peak / activations_tp1,
                    megatron_activations(tp, sp, double(H), double(T), double(C)) /
                        megatron_activations(1, false, double(H), double(T), double(C)));
        if (tp > 1) {
          const auto [want_f, want_b] = expected(L, sp, B * T * C * 4, B * T * 4);
          std::printf("  forward       %s\n  expected      %s\n", describe(fwd).c_str(), describe(want_f).c_str());
          std::printf("  backward      %s\n  expected      %s\n", describe(bwd).c_str(), describe(want_b).c_str());
          std::printf("  (Megatron: per layer 2 %s of [b,s,h] = %.1f KiB each way, + embedding, head, cross-entropy)"
                      " -> %s\n",
                      sp ? "all-gathers + 2 reduce-scatters" : "all-reduces", bsh_kib,
                      same(fwd, want_f) && same(bwd, want_b) ? "measured = expected" : "MEASURED DIFFERS");
        }
        std::printf("  forward + backward %.1f ms\n\n", ms);
      }
    }
    return 0;
  });
}
