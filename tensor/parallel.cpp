#include "tensor/parallel.h"

#include "tensor/cpu/parallel.h"

namespace loom {

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn) {
  cpu::parallel_for(n, grain, fn);
}

void parallel_for_tasks(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn) {
  cpu::parallel_for_tasks(n, fn);
}

OneCoreGuard::OneCoreGuard() : saved_(cpu::t_one_core) { cpu::t_one_core = true; }
OneCoreGuard::~OneCoreGuard() { cpu::t_one_core = saved_; }

}  // namespace loom
