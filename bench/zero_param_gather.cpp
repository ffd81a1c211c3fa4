// bench_zero_param_gather: the exposed communication of ZeRO-1's param
// all-gather, waited for before the forward (finish_param_sync) or overlapped
// with it (--overlap-param-gather: each layer's forward pre-hook waits for its
// own buckets; optim/param_gather_overlap.h). Issue 17, item 4.
//
// world = dp. A GPT of --layers blocks, its gradient buffer cut into small
// buckets (--bucket-mb) so that there are several all-gathers; AdamW with
// clipping on (1.0), which rules out the early steps of zero_overlap.h. Each
// layer's forward "computes" F ms more (a sleep in a forward pre-hook,
// registered after the overlap's), and the dp group is slowed so that each
// collective takes C ms more (bench/slow_group.h): real all-gathers of a small
// model on one machine take microseconds.
//   exposed = (end of forward - end of step()) - forward alone
// where "forward alone" is the same forward with every param already gathered.
// Without the overlap it is about (buckets) x C; with it about one bucket's C,
// as long as a layer's F covers the next buckets' gathers.
// Times: the slowest rank's, median over --steps.
//
// Usage: mpirun -np 2 build/bench/bench_zero_param_gather [--layers 4] [--bucket-mb 0.05]
//        [--simulate-ms 5] [--comm-ms 5] [--steps 7]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "bench/slow_group.h"
#include "bench/timing.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "optim/distributed_optimizer.h"
#include "optim/param_groups.h"
#include "parallel/comm/distributed.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

using namespace loom::bench;  // ms_since, max_over_ranks, median (bench/timing.h)

struct Options {
  nn::GPTConfig cfg{32, 16, 4, 2, 32, 0.0, 1};
  double bucket_mb = 0.05, simulate_ms = 5, comm_ms = 5;
  int steps = 7;
};

struct Measured {
  double exposed_ms = 0;  // median
  size_t buckets = 0;
};

Measured measure(const Options& o, bool overlap) {
  parallel::ProcessGroup& world = parallel::world();
  bench::SlowProcessGroup slow(world, std::chrono::microseconds(int64_t(o.comm_ms * 1000)));
  nn::GPT model(o.cfg);
  parallel::ZeroDataParallelBucket dp(model.named_parameters(), slow, parallel::GradReduce::ReduceScatter, o.bucket_mb);
  optim::MixedPrecisionOptions mp;
  mp.max_grad_norm = 1.0;
  mp.grad_stats_group = &world;
  optim::DistributedOptimizer opt(optim::gpt_param_groups(model, 1e-3, 0.1), dp, mp);
  if (overlap) opt.overlap_param_gather(model.layers());
  std::vector<autograd::RemovableHandle> compute;  // after the overlap's hooks: wait, then "compute"
  for (const auto& layer : model.layers())
    compute.push_back(layer->register_forward_pre_hook([f = std::chrono::microseconds(int64_t(o.simulate_ms * 1000))](
                                                           nn::Module&, const Tensor&) { std::this_thread::sleep_for(f); }));
  Generator g(3);
  Tensor x = randint(0, o.cfg.vocab_size, {2, o.cfg.block_size}, g), y = randint(0, o.cfg.vocab_size, {2, o.cfg.block_size}, g);
  std::vector<double> exposed;
  for (int s = -1; s < o.steps; ++s) {  // step -1: warm-up (step() launches the first all-gathers)
    world.barrier();
    const Clock::time_point t0 = Clock::now();
    if (!overlap) opt.finish_param_sync();
    Tensor loss = nn::cross_entropy_loss(model.forward(x), y);
    const double with_wait = ms_since(t0);
    double alone;
    {
      NoGradGuard no_grad;  // every param is in place now: the forward's own time
      opt.finish_param_sync();
      const Clock::time_point t1 = Clock::now();
      model.forward(x);
      alone = ms_since(t1);
    }
    autograd::backward(loss);
    opt.step();
    dp.reset();
    if (s >= 0) exposed.push_back(max_over_ranks(with_wait - alone));
  }
  opt.finish_param_sync();
  return {median(exposed), dp.bucket_manager().buckets().size()};
}

}  // namespace

int main(int argc, char** argv) {
  return parallel::run(argc, argv, [&] {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      if (k == "--layers") o.cfg.n_layer = std::atoll(argv[i + 1]);
      else if (k == "--embd") o.cfg.n_embd = std::atoll(argv[i + 1]);
      else if (k == "--bucket-mb") o.bucket_mb = std::atof(argv[i + 1]);
      else if (k == "--simulate-ms") o.simulate_ms = std::atof(argv[i + 1]);
      else if (k == "--comm-ms") o.comm_ms = std::atof(argv[i + 1]);
      else if (k == "--steps") o.steps = std::atoi(argv[i + 1]);
      else LOOM_CHECK(false, "bench_zero_param_gather: unknown option ", k);
    }
    ops::set_num_threads(1);
    Measured waited = measure(o, false), overlapped = measure(o, true);
    if (parallel::world().rank() != 0) return 0;
    std::printf("dp %d, GPT %lld layers (%lld with embedding and head), embd %lld; %zu buckets of <= %.3f MB; "
                "clipping on; per layer forward + %.1f ms, per collective + %.1f ms (simulated)\n",
                parallel::world().size(), (long long)o.cfg.n_layer, (long long)o.cfg.num_layers(),
                (long long)o.cfg.n_embd, waited.buckets, o.bucket_mb, o.simulate_ms, o.comm_ms);
    std::printf("  exposed param all-gather, finish_param_sync() before forward: %7.1f ms\n", waited.exposed_ms);
    std::printf("  exposed param all-gather, --overlap-param-gather:             %7.1f ms\n", overlapped.exposed_ms);
    std::printf("  overlapped / waited = %.3f\n", overlapped.exposed_ms / waited.exposed_ms);
    return 0;
  });
}
