// LOOM_CUDA_KERNELS, read once (kernel_choice.h). Plain C++, in every build.
#include "tensor/cuda/kernel_choice.h"

#include <atomic>
#include <cstdlib>

#include "tensor/error.h"

namespace loom::cuda {
namespace {

constexpr int kUnset = -1;
std::atomic<int> chosen{kUnset};

}  // namespace

KernelChoice parse_kernel_choice(const std::string& name) {
  if (name == "reference") return KernelChoice::Reference;
  if (name == "fast") return KernelChoice::Fast;
  throw Error(str("LOOM_CUDA_KERNELS / --cuda-kernels: expected 'fast' or 'reference', got '", name, "'"));
}

const char* kernel_choice_name(KernelChoice k) { return k == KernelChoice::Fast ? "fast" : "reference"; }

KernelChoice kernel_choice() {
  int k = chosen.load(std::memory_order_relaxed);
  if (k == kUnset) {
    const char* env = std::getenv("LOOM_CUDA_KERNELS");
    k = int(env && *env ? parse_kernel_choice(env) : KernelChoice::Reference);
    chosen.store(k, std::memory_order_relaxed);
  }
  return KernelChoice(k);
}

void set_kernel_choice(KernelChoice k) { chosen.store(int(k), std::memory_order_relaxed); }

}  // namespace loom::cuda
