#include "tensor/parallel.h"

#include "tensor/cpu/parallel.h"

namespace loom {

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn) {
  cpu::parallel_for(n, grain, fn);
}

void parallel_for_tasks(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn) {
  cpu::parallel_for_tasks(n, fn);
}

}  // namespace loom
