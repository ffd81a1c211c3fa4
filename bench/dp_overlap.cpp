// bench_dp_overlap: how much gradient communication each data-parallel mode
// leaves exposed, on a GPT, and the resulting training throughput.
//
// Every rank runs the same steps (forward + backward on its own micro-batch)
// three ways in one job:
//   local   no wrapper, no communication: the compute alone
//   naive   DataParallelNaive: one blocking all-reduce per parameter, inside backward
//   bucket  DataParallelBucket: async bucket all-reduces overlapping backward,
//           the remainder waited for in the engine callback at its end
// exposed communication = backward time(mode) - backward time(local): the part
// of the all-reduces that was not hidden behind compute. For scale, the table
// also gives one blocking all-reduce of all gradients (the cost with no overlap).
// tokens/s counts the global batch (dp x batch x block) per forward+backward.
// Times are medians over rounds (the modes take turns), each the slowest rank's.
//
// Target (issue 4): bucket <= half of naive, at dp 2 and dp 4.
//
// The bucket cap defaults to train_gpt's (25 MB, PyTorch DDP's and picotron's
// default). On the default 4-layer GPT (3.2 MB of gradients) that is one
// bucket: nothing overlaps, and what bucketing buys is one large all-reduce
// instead of one per parameter. --bucket-mb 1 cuts it into buckets that do
// overlap backward - which pays only where communication has cores (or a
// NIC, or NCCL's kernels) that compute is not using (bench/README.md).
//
// Usage: mpirun -np 2 build/bench/bench_dp_overlap [--layers 4] [--embd 128]
//        [--heads 4] [--block 64] [--batch 8] [--bucket-mb 25] [--steps 10]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/variable.h"
#include "bench/timing.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "parallel/comm/distributed.h"
#include "parallel/data_parallel/data_parallel_bucket.h"
#include "parallel/data_parallel/data_parallel_naive.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

using namespace loom::bench;  // ms_since, max_over_ranks, median (bench/timing.h)

struct Timing {
  double forward_ms, backward_ms;
};

}  // namespace

int main(int argc, char** argv) {
  return parallel::run(argc, argv, [&] {
    int64_t layers = 4, embd = 128, heads = 4, block = 64, batch = 8, steps = 10;
    double bucket_mb = 25.0;  // train_gpt's --bucket-mb default
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string k = argv[i];
      double v = std::atof(argv[i + 1]);
      if (k == "--layers") layers = int64_t(v);
      else if (k == "--embd") embd = int64_t(v);
      else if (k == "--heads") heads = int64_t(v);
      else if (k == "--block") block = int64_t(v);
      else if (k == "--batch") batch = int64_t(v);
      else if (k == "--steps") steps = int64_t(v);
      else if (k == "--bucket-mb") bucket_mb = v;
      else LOOM_CHECK(false, "bench_dp_overlap: unknown option ", k);
    }
    ops::set_num_threads(1);  // one core per rank
    parallel::ProcessGroup& dp = parallel::world();
    const bool root = dp.rank() == 0;

    nn::GPTConfig cfg{65, block, layers, heads, embd, 0.0, 1337};
    nn::GPT model(cfg);
    auto named = model.named_parameters();
    std::vector<Tensor> params = model.parameters();
    int64_t n_params = model.num_parameters();
    Generator gen(100 + uint64_t(dp.rank()));

    // One step: forward + backward on a fresh micro-batch, times in ms (slowest rank).
    auto step = [&]() {
      Tensor x = randint(0, cfg.vocab_size, {batch, block}, gen);
      Tensor y = randint(0, cfg.vocab_size, {batch, block}, gen);
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      Tensor loss = nn::cross_entropy_loss(model.forward(x), y);
      double f = ms_since(t0);
      auto t1 = Clock::now();
      autograd::backward(loss);
      double b = ms_since(t1);
      return Timing{max_over_ranks(f), max_over_ranks(b)};
    };
    // The modes take turns, one wrap + a warm-up step + a measured step each
    // round, so that load from elsewhere on the machine hits all three alike.
    enum Mode { kLocal, kNaive, kBucket };
    std::vector<double> fwd[3], bwd[3];
    int num_buckets = 0;
    for (int64_t round = 0; round < steps; ++round) {
      for (int mode : {kLocal, kNaive, kBucket}) {
        std::unique_ptr<parallel::DataParallelNaive> naive;
        std::unique_ptr<parallel::DataParallelBucket> bucket;
        if (mode == kNaive) naive = std::make_unique<parallel::DataParallelNaive>(named, dp);
        if (mode == kBucket) bucket = std::make_unique<parallel::DataParallelBucket>(
            named, dp, parallel::BucketOptions{.bucket_cap_mb = bucket_mb});
        if (bucket) num_buckets = int(bucket->bucket_manager().buckets().size());
        for (int k = 0; k < 2; ++k) {
          Timing t = step();
          if (bucket) bucket->reset();
          else autograd::zero_grad(params);
          if (k == 1) fwd[mode].push_back(t.forward_ms), bwd[mode].push_back(t.backward_ms);
        }
      }
    }
    Timing local{median(fwd[kLocal]), median(bwd[kLocal])}, naive{median(fwd[kNaive]), median(bwd[kNaive])},
        bucket{median(fwd[kBucket]), median(bwd[kBucket])};
    // One blocking all-reduce of every gradient at once: communication with no overlap.
    Tensor all = zeros({n_params});
    std::vector<double> ar;
    for (int i = 0; i < 5; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = Clock::now();
      dp.all_reduce(all, parallel::ReduceOp::Avg);
      ar.push_back(max_over_ranks(ms_since(t0)));
    }

    if (root) {
      const double tokens = double(dp.size() * batch * block);
      auto exposed = [&](const Timing& t) { return std::max(0.0, t.backward_ms - local.backward_ms); };
      std::printf("GPT %lld layers, %lld embd, %lld heads, block %lld: %lld params (%.1f MB fp32 gradients)\n",
                  (long long)layers, (long long)embd, (long long)heads, (long long)block, (long long)n_params,
                  double(n_params) * 4 / 1e6);
      std::printf("dp %d, batch %lld per rank, bucket cap %.2f MB (%d buckets), medians of %lld rounds\n", dp.size(),
                  (long long)batch, bucket_mb, num_buckets, (long long)steps);
      std::printf("one blocking all-reduce of all gradients: %.2f ms\n", median(ar));
      std::printf("%-8s %12s %12s %16s %14s\n", "mode", "forward ms", "backward ms", "exposed comm ms",
                  "tokens/s");
      for (auto [name, t] : {std::pair{"local", local}, std::pair{"naive", naive}, std::pair{"bucket", bucket}}) {
        std::printf("%-8s %12.2f %12.2f %16.2f %14.0f\n", name, t.forward_ms, t.backward_ms, exposed(t),
                    tokens / ((t.forward_ms + t.backward_ms) / 1000));
      }
      std::printf("(local: no communication; its tokens/s counts all ranks' tokens as if they were one run)\n");
      const double naive_exposed = exposed(naive), bucket_exposed = exposed(bucket);
      if (naive_exposed <= 0) {
        std::printf("exposed comm, bucket / naive: n/a (naive exposed nothing: noise, measure again)\n");
      } else {
        const double ratio = bucket_exposed / naive_exposed;
        std::printf("exposed comm, bucket / naive: %.2f (target <= 0.50): %s%s\n", ratio, ratio <= 0.5 ? "ok" : "OUT",
                    num_buckets == 1 ? " - one bucket: nothing overlaps, the gain is one message instead of many" : "");
      }
    }
    return 0;
  });
}
