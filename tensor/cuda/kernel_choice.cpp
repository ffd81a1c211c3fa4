// LOOM_CUDA_KERNELS (kernel_choice.h). Built with or without CUDA: nn/ asks
// before it knows whether a tensor is on a GPU.
#include "tensor/cuda/kernel_choice.h"

#include <cstdlib>
#include <string>

#include "tensor/error.h"

namespace loom::cuda {

KernelChoice kernel_choice() {
  const char* env = std::getenv("LOOM_CUDA_KERNELS");
  const std::string value = env ? env : "";
  if (value.empty() || value == "reference") return KernelChoice::Reference;
  if (value == "fast") return KernelChoice::Fast;
  throw Error(str("LOOM_CUDA_KERNELS=", value, ": expected fast or reference"));
}

}  // namespace loom::cuda
