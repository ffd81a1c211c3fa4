// bench_moe_phases: the time of each step of one mixture-of-experts layer
// (nn/moe.h), forward and backward, at train_gpt's laptop config by default
// (docs/19-mixture-of-experts.md: 16 x 32 tokens, C 64, 4 experts of width 88,
// top-2). bench/moe.sh runs it beside train_gpt's whole step and prints each
// step's share. The steps, as Megatron's token dispatcher names them:
//   router    gate GEMM [N, C] x [E, C]ᵀ, softmax, top-k on the host, the
//             renormalised weights (and their backward into the gate)
//   map       which rows go where (the host; no backward)
//   permute   x [N, C] -> [M, C] (a gather; backward sums each token's copies)
//   experts   E SwiGLU chains on their groups of rows (Megatron's SequentialMLP)
//   unpermute [M, C] -> [N, C], weighted by the router (backward: into y and the weights)
// Each step runs on a detached copy of the previous step's output, so its
// backward is timed alone: backward(output, the next step's input gradient).
// With expert parallelism dispatch and combine would sit between permute and
// experts, and experts and unpermute (train_gpt --ep: bench/moe.sh).
//
// Usage: bench_moe_phases [--tokens N] [--embd C] [--experts E] [--experts-per-token K]
//                         [--mlp-hidden I] [--reps R] [--threads T]
// Prints one line a step:  phase=<name> fwd_ms=<median> bwd_ms=<median>
//   and then:              total_ms=<sum of the medians>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "bench/timing.h"
#include "nn/moe.h"
#include "nn/moe_router.h"
#include "nn/moe_token_dispatcher.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;
using bench::Clock;

namespace {

struct Phase {
  const char* name;
  std::vector<double> fwd, bwd;
};

// A leaf copy of t that backward fills: the next step's input.
Tensor leaf(const Tensor& t) { return autograd::set_requires_grad(autograd::detach(t)); }

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 16 * 32, C = 64, E = 4, K = 2, I = 88, reps = 50, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (f == "--tokens") N = v;
    else if (f == "--embd") C = v;
    else if (f == "--experts") E = v;
    else if (f == "--experts-per-token") K = v;
    else if (f == "--mlp-hidden") I = v;
    else if (f == "--reps") reps = v;
    else if (f == "--threads") threads = v;
    else return std::fprintf(stderr, "bench_moe_phases: unknown flag %s\n", f.c_str()), 2;
  }
  ops::set_num_threads(int(threads));
  Generator gen(0);
  nn::MoEOptions o;
  o.experts = E, o.experts_per_token = K;
  nn::MoE layer(C, I, o, gen, 0.02);
  const std::vector<std::shared_ptr<nn::Expert>> experts(layer.experts->begin(), layer.experts->end());
  const Tensor x = randn({N, C}, gen);
  std::vector<Phase> phases{{"router", {}, {}}, {"map", {}, {}}, {"permute", {}, {}}, {"experts", {}, {}},
                            {"unpermute", {}, {}}};
  for (int64_t r = 0; r < reps + 2; ++r) {  // the first two warm up (allocations, oneDNN's JIT)
    double t[5], b[5];
    auto t0 = Clock::now();
    const Tensor x_in = leaf(x);
    const nn::RouterOutput route = nn::route_top_k(x_in, layer.gate->weight, K);  // weights [N, K]
    t[0] = bench::ms_since(t0), t0 = Clock::now();
    const nn::RoutingMap map = nn::make_routing_map(route.chosen, E);
    t[1] = bench::ms_since(t0), t0 = Clock::now();
    const Tensor x_perm = leaf(x);
    const Tensor permuted = nn::permute(x_perm, map);  // [M, C]
    t[2] = bench::ms_since(t0), t0 = Clock::now();
    const Tensor p_in = leaf(permuted);
    const Tensor y = nn::expert_compute(p_in, map.tokens_per_expert, experts);  // [M, C]
    t[3] = bench::ms_since(t0), t0 = Clock::now();
    const Tensor y_in = leaf(y), w_in = leaf(route.weights);
    const Tensor out = nn::unpermute(y_in, w_in, map);  // [N, C]
    t[4] = bench::ms_since(t0), t0 = Clock::now();
    // Backward, last step first, each from the gradient the next one left in its input.
    autograd::backward({out}, {ones(out.shape())});
    b[4] = bench::ms_since(t0), t0 = Clock::now();
    autograd::backward({y}, {autograd::grad(y_in)});
    b[3] = bench::ms_since(t0), t0 = Clock::now();
    autograd::backward({permuted}, {autograd::grad(p_in)});
    b[2] = bench::ms_since(t0), t0 = Clock::now();
    autograd::backward({route.weights}, {autograd::grad(w_in)});
    b[0] = bench::ms_since(t0);
    b[1] = 0;
    autograd::zero_grad(layer.parameters());
    if (r < 2) continue;
    for (size_t k = 0; k < phases.size(); ++k) phases[k].fwd.push_back(t[k]), phases[k].bwd.push_back(b[k]);
  }
  double total = 0;
  for (const Phase& p : phases) {
    const double f = bench::median(p.fwd), b = bench::median(p.bwd);
    total += f + b;
    std::printf("phase=%s fwd_ms=%.4f bwd_ms=%.4f\n", p.name, f, b);
  }
  std::printf("total_ms=%.4f tokens=%lld embd=%lld experts=%lld k=%lld mlp_hidden=%lld threads=%lld\n", total,
              (long long)N, (long long)C, (long long)E, (long long)K, (long long)I, (long long)threads);
  return 0;
}
