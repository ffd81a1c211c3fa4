// Which CUDA kernels run the ops that have two: the readable reference
// kernels (tensor/cuda/*.cu, the default) or the fast ones (tensor/cuda/fast/).
// The fast kernels are the default only once a GPU run has passed them
// (tensor/cuda/README.md). Chosen by LOOM_CUDA_KERNELS=fast|reference in the
// environment, read at the first call, or by set_kernel_choice (tests, benches).
#pragma once

#include <string>

namespace loom::cuda {

enum class KernelChoice { Reference, Fast };

// "reference" or "fast"; anything else throws, naming the value and the variable.
KernelChoice parse_kernel_choice(const std::string& name);
const char* kernel_choice_name(KernelChoice k);

// LOOM_CUDA_KERNELS at the first call (Reference when unset), unless set since.
KernelChoice kernel_choice();
void set_kernel_choice(KernelChoice k);
inline bool fast_kernels() { return kernel_choice() == KernelChoice::Fast; }

}  // namespace loom::cuda
