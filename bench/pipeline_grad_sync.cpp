// bench_pipeline_grad_sync: what finishing the data-parallel gradient sync
// after the pipeline schedule (Megatron's order) saves over finishing it
// inside each stage's last backward (issue 17, item 3).
//
// world = dp 2 x pp (world / 2). Each stage "computes" a fixed time per
// micro-batch (its forward also sleeps F ms, its backward 2F: bench/simulated_stage.h,
// as in bench_pipeline_memory) and its dp group is slowed so that every
// collective takes C ms more (SlowProcessGroup, bench/slow_group.h): on a
// 2-core machine the real all-reduces of a small model take microseconds and
// the stages would fight over the cores. Two orders, same schedule (1F1B):
//   in backward     the old order: the last backward's engine callback waits
//                   for the bucket all-reduces before the stage sends its
//                   last gradient upstream, so stage s - 1's last backward
//                   waits for stage s's whole sync, and the cool-down grows by
//                   one sync per stage: about (pp - 1) x C more per step;
//   after schedule  the last backward launches the all-reduces, the stage
//                   sends, and finish_grad_sync() waits after the schedule:
//                   the stages' syncs overlap one another.
// Step time = the slowest rank's, median over --steps (the orders take turns).
//
// Usage: mpirun -np 4 build/bench/bench_pipeline_grad_sync [--m 8] [--simulate-ms 5] [--comm-ms 20] [--steps 5]
//        mpirun --oversubscribe -np 8 build/bench/bench_pipeline_grad_sync      # dp 2 x pp 4
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/function.h"
#include "bench/timing.h"
#include "bench/simulated_stage.h"
#include "bench/slow_group.h"
#include "nn/loss.h"
#include "parallel/comm/distributed.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/pipeline_parallel/pipeline_schedule.h"
#include "parallel/process_group_manager.h"
#include "tensor/ops.h"

using namespace loom;
using namespace loom::parallel;
using loom::bench::max_over_ranks;
using loom::bench::median;

namespace {

// The old order, for comparison: ignores defer_grad_sync(), so the wrapped
// DataParallelBucket finishes its sync in the last backward's engine callback.
class SyncInLastBackward : public DataParallel {
 public:
  explicit SyncInLastBackward(DataParallelBucket& inner) : inner_(inner) {}
  NoSyncGuard no_sync() override { return inner_.no_sync(); }
  DeferSyncGuard defer_grad_sync() override { return DeferSyncGuard(ignored_); }
  void zero_grad() override { inner_.zero_grad(); }
  void finish_grad_sync() override {}  // done already, inside backward

 private:
  DataParallelBucket& inner_;
  bool ignored_ = true;
};


}  // namespace

int main(int argc, char** argv) {
  return parallel::run(argc, argv, [&] {
    int m = 8, steps = 5;
    double simulate_ms = 5, comm_ms = 20;
    nn::GPTConfig cfg{32, 16, 6, 2, 16, 0.0, 1};
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      if (k == "--m") m = std::atoi(argv[i + 1]);
      else if (k == "--steps") steps = std::atoi(argv[i + 1]);
      else if (k == "--simulate-ms") simulate_ms = std::atof(argv[i + 1]);
      else if (k == "--comm-ms") comm_ms = std::atof(argv[i + 1]);
      else if (k == "--layers") cfg.n_layer = std::atoll(argv[i + 1]);
      else LOOM_CHECK(false, "bench_pipeline_grad_sync: unknown option ", k);
    }
    ops::set_num_threads(1);
    const int world = parallel::world().size();
    LOOM_CHECK(world % 2 == 0 && world >= 4, "bench_pipeline_grad_sync: run on 2 x pp ranks (4, 8, ...)");
    const int dp = 2, pp = world / 2;
    ProcessGroupManager pgm(dp, pp);
    LayerRange range = partition_uniform(cfg.num_layers(), pp)[size_t(pgm.pp_rank)][0];
    std::unique_ptr<ModelChunks> stage_ptr =
        bench::simulated_stage(cfg, {range}, std::chrono::microseconds(int64_t(simulate_ms * 1000)));
    ModelChunks& stage = *stage_ptr;
    PipelineP2P p2p(pgm.pp_group());
    bench::SlowProcessGroup slow_dp(pgm.dp_group(), std::chrono::microseconds(int64_t(comm_ms * 1000)));
    DataParallelBucket bucket(stage.named_parameters(), slow_dp, BucketOptions{});
    SyncInLastBackward old_order(bucket);

    Generator g(7);
    std::vector<MicroBatch> mbs;
    for (int i = 0; i < m; ++i)
      mbs.push_back({randint(0, cfg.vocab_size, {2, cfg.block_size}, g), randint(0, cfg.vocab_size, {2, cfg.block_size}, g)});
    LossFn loss_fn = [](const Tensor& logits, const Tensor& y) { return nn::cross_entropy_loss(logits, y); };

    auto step_ms = [&](DataParallel& dp_wrap) {
      parallel::world().barrier();
      const auto t0 = std::chrono::steady_clock::now();
      train_step_pipeline_1f1b(stage, p2p, mbs, loss_fn, &dp_wrap);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      bucket.reset();
      return max_over_ranks(ms);
    };
    step_ms(bucket), step_ms(old_order);  // warm-up
    std::vector<double> before, after;
    for (int s = 0; s < steps; ++s) {
      before.push_back(step_ms(old_order));
      after.push_back(step_ms(bucket));
    }
    if (parallel::world().rank() != 0) return 0;
    const double b = median(before), a = median(after);
    std::printf("dp %d x pp %d, 1f1b, m %d; per micro-batch F %.1f ms, B %.1f ms (simulated); dp sync: %zu bucket(s) "
                "per stage, each collective + %.1f ms (simulated)\n",
                dp, pp, m, simulate_ms, 2 * simulate_ms, bucket.bucket_manager().buckets().size(), comm_ms);
    std::printf("  step time, sync inside the last backward (before): %8.1f ms\n", b);
    std::printf("  step time, sync after the schedule (after):        %8.1f ms\n", a);
    std::printf("  after / before = %.3f; saved %.1f ms (theory: about (pp - 1) x sync = %.1f ms)\n", a / b, b - a,
                (pp - 1) * comm_ms);
    return 0;
  });
}
