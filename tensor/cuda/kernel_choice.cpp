// LOOM_CUDA_KERNELS and set_kernel_choice (kernel_choice.h). Plain C++, in
// every build: nn/ and train_gpt ask before they know whether a tensor is on a GPU.
#include "tensor/cuda/kernel_choice.h"

#include <atomic>
#include <cstdlib>

#include "tensor/error.h"

namespace loom::cuda {
namespace {

constexpr int kFromEnvironment = -1;
std::atomic<int> chosen{kFromEnvironment};

}  // namespace

KernelChoice parse_kernel_choice(const std::string& name, const char* source) {
  if (name.empty() || name == "reference") return KernelChoice::Reference;
  if (name == "fast") return KernelChoice::Fast;
  throw Error(str(source, "=", name, ": expected fast or reference"));
}

const char* kernel_choice_name(KernelChoice k) { return k == KernelChoice::Fast ? "fast" : "reference"; }

KernelChoice kernel_choice() {
  const int k = chosen.load(std::memory_order_relaxed);
  if (k != kFromEnvironment) return KernelChoice(k);
  const char* env = std::getenv("LOOM_CUDA_KERNELS");  // cheap: once per row op
  return parse_kernel_choice(env ? env : "");
}

void set_kernel_choice(KernelChoice k) { chosen.store(int(k), std::memory_order_relaxed); }
void reset_kernel_choice() { chosen.store(kFromEnvironment, std::memory_order_relaxed); }

}  // namespace loom::cuda
