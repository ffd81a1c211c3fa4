// The launch counter (launch_count.h): plain C++, in every build.
#include "tensor/cuda/launch_count.h"

namespace loom::cuda::detail {

std::atomic<int64_t> g_launches{0};

}  // namespace loom::cuda::detail
