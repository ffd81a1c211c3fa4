// bench_attention: one layer's causal attention core, q, k, v [B, H, T, hd]
// -> [B, H, T, hd], by the composition (matmul, causal_softmax, matmul: the
// [T, T] scores and weights in memory) and by flash attention
// (autograd::flash_attention: tensor/cuda/fast/ on a GPU), side by side in
// one run: forward, forward + backward (ms, median of --steps), and the
// peak memory each adds. On a GPU in bf16/fp16 at head size 64, flash
// attention twice: on the CUDA cores (LOOM_CUDA_KERNELS=reference) and on the
// tensor cores (fast: tensor/cuda/fast/flash_attention_mma*.cu, forward and
// backward); at head size 128 (--hd 128) the tensor cores alone. Default
// shape: GPT-2 124M's (B 16, 12 heads, T 1024, head 64); the step has 12 such layers.
//
// Usage: bench_attention [--device cuda|cpu] [--dtype fp32|bf16|fp16]
//                        [--B 16] [--H 12] [--T 1024] [--hd 64] [--steps 5] [--warmup 2]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/flash_attention.h"
#include "autograd/functions.h"
#include "autograd/variable.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/generator.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/storage.h"

using namespace loom;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string device = "cuda", dtype = "bf16";
  int64_t B = 16, H = 12, T = 1024, hd = 64;
  int steps = 5, warmup = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw Error(str("bench_attention: ", k, " needs a value"));
    const char* v = argv[++i];
    if (k == "--device") a.device = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--B") a.B = std::stoll(v);
    else if (k == "--H") a.H = std::stoll(v);
    else if (k == "--T") a.T = std::stoll(v);
    else if (k == "--hd") a.hd = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else throw Error(str("bench_attention: unknown option ", k));
  }
  return a;
}

DType dtype_of(const std::string& s) {
  if (s == "fp32") return kFloat32;
  if (s == "bf16") return kBFloat16;
  if (s == "fp16") return kFloat16;
  throw Error(str("bench_attention: --dtype ", s, ": expected fp32, bf16 or fp16"));
}

struct Timing {
  double forward_ms, step_ms, peak_mib;
};

// Median ms of `steps` calls of fn (after `warmup`), each ended by a device sync.
double median_ms(const Args& a, const Device& dev, const std::function<void()>& fn) {
  auto sync = [&] { if (dev.is_cuda()) cuda::synchronize(dev); };
  for (int i = 0; i < a.warmup; ++i) fn();
  sync();
  std::vector<double> ms;
  for (int i = 0; i < a.steps; ++i) {
    const auto t0 = Clock::now();
    fn();
    sync();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

using Core = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

Timing measure(const Args& a, const Device& dev, DType dt, const Core& core) {
  Generator g(1);
  auto leaf = [&] { return autograd::set_requires_grad(ops::to(randn({a.B, a.H, a.T, a.hd}, g, dt), dev)); };
  Tensor q = leaf(), k = leaf(), v = leaf();
  Tensor w = ops::to(randn({a.B, a.H, a.T, a.hd}, g, dt), dev);
  Timing t{};
  t.forward_ms = median_ms(a, dev, [&] {
    NoGradGuard no_grad;
    core(q, k, v);
  });
  const int64_t base = memory_stats(dev).live_bytes;
  reset_peak_memory_stats(dev);
  t.step_ms = median_ms(a, dev, [&] {
    Tensor o = core(q, k, v);
    autograd::backward({o}, {w});
    autograd::zero_grad({q, k, v});
  });
  t.peak_mib = double(memory_stats(dev).peak_bytes - base) / (1 << 20);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const Device dev(a.device == "cuda" ? "cuda:0" : a.device);
    const DType dt = dtype_of(a.dtype);
    const double scale = 1.0 / std::sqrt(double(a.hd));
    std::printf("bench_attention: B %lld, H %lld, T %lld, hd %lld, %s on %s, median of %d steps\n", (long long)a.B,
                (long long)a.H, (long long)a.T, (long long)a.hd, a.dtype.c_str(), dev.str().c_str(), a.steps);
    Core composition = [scale](const Tensor& q, const Tensor& k, const Tensor& v) {
      using namespace autograd;
      return matmul(causal_softmax(matmul(q, transpose(k, -2, -1)), scale), v);
    };
    Core flash = [scale](const Tensor& q, const Tensor& k, const Tensor& v) {
      return autograd::flash_attention(q, k, v, scale);
    };
    auto with = [&](cuda::KernelChoice k, const Core& core) {
      cuda::set_kernel_choice(k);
      const Timing t = measure(a, dev, dt, core);
      cuda::reset_kernel_choice();
      return t;
    };
    const Timing c = with(cuda::KernelChoice::Reference, composition);
    std::printf("%-20s %12s %16s %14s\n", "path", "forward ms", "fwd + bwd ms", "peak MiB");
    std::printf("%-20s %12.3f %16.3f %14.1f\n", "composition", c.forward_ms, c.step_ms, c.peak_mib);
    Timing f{};
    if (a.hd <= 64) {  // the CUDA-core kernels keep rows in registers: head size <= 64
      f = with(cuda::KernelChoice::Reference, flash);
      std::printf("%-20s %12.3f %16.3f %14.1f\n", "flash", f.forward_ms, f.step_ms, f.peak_mib);
      std::printf("speed-up (composition ms / flash ms): forward %.2f, fwd + bwd %.2f; memory: %.1fx less\n",
                  c.forward_ms / f.forward_ms, c.step_ms / f.step_ms, c.peak_mib / std::max(f.peak_mib, 1e-9));
    }
    if (dev.is_cuda() && dt != kFloat32 && (a.hd == 64 || a.hd == 128)) {  // what the tensor-core kernels take
      const Timing m = with(cuda::KernelChoice::Fast, flash);
      std::printf("%-20s %12.3f %16.3f %14.1f\n", "flash, tensor cores", m.forward_ms, m.step_ms, m.peak_mib);
      if (a.hd <= 64)
        std::printf("speed-up (CUDA cores ms / tensor cores ms): forward %.2f, fwd + bwd %.2f\n",
                    f.forward_ms / m.forward_ms, f.step_ms / m.step_ms);
      else
        std::printf("speed-up (composition ms / tensor cores ms): forward %.2f, fwd + bwd %.2f\n",
                    c.forward_ms / m.forward_ms, c.step_ms / m.step_ms);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
