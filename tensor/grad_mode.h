// Grad mode: a thread-local switch that says whether ops record autograd
// graph nodes. It lives in the tensor layer (as PyTorch keeps GradMode in c10)
// so that in-place checks can consult it; autograd/ is what acts on it.
#pragma once

namespace loom {

struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// While alive, ops do not record graph nodes (optimizer steps, evaluation).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace loom
