// The fast CUDA row kernels (tensor/cuda/fast/) against the reference ones
// (tensor/cuda/rows.cu, embedding.cu), op by op, at GPT-2 124M's shapes:
// B*T = 16 x 1024 rows, C = 768, V = 50257, and the attention scores of 4 of
// the 16 sequences, [4, 12, 1024, 1024] (a quarter: the inputs are drawn on
// the host). Per op: ms per call on the GPU's clock (median of --reps after 2
// warm-up calls), both kernels, the speed-up, and the fast kernel's bytes
// moved per second (inputs read once + outputs written once, its floor).
//
//   bench_row_kernels [--reps N] [--device cuda[:N]]      (tests/cuda/gpu_runner.sh, phase 6)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda/cuda.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/generator.h"
#include "tensor/ops.h"

using namespace loom;

namespace {

// Median ms of one call of f on the GPU's clock.
double time_ms(const Device& d, int reps, const std::function<void()>& f) {
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cuda::TimingEvent a = cuda::record_timing_event(d);
    f();
    cuda::TimingEvent b = cuda::record_timing_event(d);
    ms.push_back(cuda::elapsed_ms(a, b));
    cuda::destroy_timing_event(a);
    cuda::destroy_timing_event(b);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// rows x n random values on the GPU: a [rows_drawn, n] block drawn on the host, repeated.
Tensor random_rows(const Device& d, int64_t rows, int64_t n, int64_t rows_drawn, uint64_t seed) {
  Generator gen(seed);
  Tensor block = ops::to(randn({1, rows_drawn, n}, gen, kFloat32), d);
  return ops::reshape(ops::contiguous(ops::expand(block, {rows / rows_drawn, rows_drawn, n})), {rows, n});
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  std::string device_name = "cuda";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--device")) device_name = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--device cuda[:N]]\n", argv[0]);
      return 2;
    }
  }
  if (!cuda::is_available()) {
    std::fprintf(stderr, "bench_row_kernels: no CUDA device: %s\n", cuda::unavailable_reason().c_str());
    return 1;
  }
  try {
    const Device d(device_name);
    const int64_t BT = 16 * 1024, C = 768, V = 50257, H = 12, T = 1024, B_att = 4;
    Tensor x = random_rows(d, BT, C, 1024, 1), dy = random_rows(d, BT, C, 1024, 2);
    Tensor w = ops::to(full({C}, 1.0, kFloat32), d), b = ops::to(full({C}, 0.1, kFloat32), d);
    Tensor logits = random_rows(d, BT, V, 256, 3);
    std::vector<int64_t> ids(static_cast<size_t>(BT));
    for (int64_t i = 0; i < BT; ++i) ids[size_t(i)] = (i * 7919) % V;
    Tensor targets = ops::to(from_vector(ids, {BT}), d);
    Tensor scores = ops::reshape(random_rows(d, B_att * H * T, T, 1024, 4), {B_att, H, T, T});
    Tensor dscores = ops::reshape(random_rows(d, B_att * H * T, T, 1024, 5), {B_att, H, T, T});
    const ops::LayerNormResult ln = ops::layer_norm(x, w, b, 1e-5);
    const Tensor att = ops::causal_softmax(scores, 0.125);
    const ops::CrossEntropyResult ce = ops::cross_entropy(logits, targets);
    const Tensor one = ops::to(full({}, 1.0, kFloat32), d);

    struct Op {
      const char* name;
      double bytes;  // the fast kernel's floor: what it must read and write once
      std::function<void()> run;
    };
    const double f4 = 4.0;
    const std::vector<Op> ops_list = {
        {"layer_norm [16384, 768]", f4 * BT * C * 2, [&] { ops::layer_norm(x, w, b, 1e-5); }},
        {"layer_norm_backward (dx, dw, db)", f4 * BT * C * 3,
         [&] { ops::layer_norm_backward(dy, x, w, ln.mean, ln.rstd); }},
        {"causal_softmax [4, 12, 1024, 1024]", f4 * B_att * H * T * T * 2, [&] { ops::causal_softmax(scores, 0.125); }},
        {"causal_softmax_backward", f4 * B_att * H * T * T * 3,
         [&] { ops::causal_softmax_backward(dscores, att, 0.125); }},
        {"softmax [16384, 1024]", f4 * BT * T * 2,
         [&] { ops::softmax(ops::reshape(scores, {B_att * H * T, T})); }},
        {"cross_entropy [16384, 50257]", f4 * BT * V, [&] { ops::cross_entropy(logits, targets); }},
        {"cross_entropy_backward", f4 * BT * V * 2,
         [&] { ops::cross_entropy_backward(one, logits, targets, ce.lse, ce.count); }},
        {"embedding_backward [16384, 768] -> [50257, 768]", f4 * (BT * C + V * C),
         [&] { ops::embedding_backward(dy, targets, V); }},
    };
    std::printf("row kernels, %s, median of %d calls (ms on the GPU's clock)\n", d.str().c_str(), reps);
    std::printf("%-48s %12s %10s %9s %10s\n", "op", "reference", "fast", "speed-up", "fast GB/s");
    for (const Op& op : ops_list) {
      cuda::set_kernel_choice(cuda::KernelChoice::Reference);
      const double ref = time_ms(d, reps, op.run);
      cuda::set_kernel_choice(cuda::KernelChoice::Fast);
      const double fast = time_ms(d, reps, op.run);
      std::printf("%-48s %12.3f %10.3f %8.1fx %10.0f\n", op.name, ref, fast, ref / fast, op.bytes / fast / 1e6);
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_row_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
