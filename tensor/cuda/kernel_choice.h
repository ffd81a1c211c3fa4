// Which CUDA kernels run the ops that have two: the readable reference
// kernels (tensor/cuda/*.cu, the default) or the fast ones (tensor/cuda/fast/).
// The fast kernels are the default only once a GPU run has passed them
// (tensor/cuda/README.md). Chosen by LOOM_CUDA_KERNELS=fast|reference in the
// environment, or by set_kernel_choice (train_gpt --cuda-kernels, tests, benches).
#pragma once

#include <string>

namespace loom::cuda {

enum class KernelChoice { Reference, Fast };

// "fast" or "reference"; anything else throws "<source>=<name>: expected fast or reference".
KernelChoice parse_kernel_choice(const std::string& name, const char* source = "LOOM_CUDA_KERNELS");
const char* kernel_choice_name(KernelChoice k);

// set_kernel_choice's choice when one is set; else LOOM_CUDA_KERNELS as it is
// now (read on every call, so a test may setenv between calls; reference when unset).
KernelChoice kernel_choice();
inline bool fast_kernels() { return kernel_choice() == KernelChoice::Fast; }
void set_kernel_choice(KernelChoice k);
void reset_kernel_choice();  // back to the environment

}  // namespace loom::cuda
