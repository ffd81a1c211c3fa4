// Which CUDA kernels run where a fast one exists beside the readable
// reference (flash attention beside the attention composition, ...): the
// environment's LOOM_CUDA_KERNELS=fast|reference, reference when unset, until
// a GPU run has passed the fast kernels. Read here and nowhere else.
#pragma once

namespace loom::cuda {

enum class KernelChoice { Reference, Fast };

// Read on every call (cheap: once per layer), so a test can set it; a value
// other than fast/reference throws, naming it.
KernelChoice kernel_choice();
inline bool fast_kernels() { return kernel_choice() == KernelChoice::Fast; }

}  // namespace loom::cuda
