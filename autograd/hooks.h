// Gradient hooks that unregister themselves: register_hook returns a
// RemovableHandle (PyTorch's torch.utils.hooks.RemovableHandle, made RAII), and
// the hook stays registered exactly as long as the handle lives. A wrapper that
// owns its handles (DataParallelNaive, DataParallelBucket) takes its hooks with
// it when it goes, so no hook can call into a destroyed object and the lesson
// files need no liveness flags.
//
//   RemovableHandle h = grad_accumulator(w)->register_hook(fn);  // fn runs each backward
//   h.remove();   // or let h go out of scope: fn never runs again
// nn::Module's forward pre-hooks use the same list and handle (nn/module.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

// fn(param): runs after param's gradient has been accumulated.
using GradHook = std::function<void(Tensor& param)>;

// What a RemovableHandle needs of a hook list: a way to take one hook out.
class HookListBase {
 public:
  virtual ~HookListBase() = default;
  virtual void remove(uint64_t id) = 0;
};

// The hooks of one AccumulateGrad node, or one param's post-accumulate hooks
// (HookList), or one module's forward pre-hooks (nn/module.h), run in
// registration order with the arguments given to run(). A hook may remove
// hooks (itself included) while they run; hooks added while they run wait for
// the next run().
template <class... Args>
class HookListOf : public HookListBase {
 public:
  using Fn = std::function<void(Args...)>;
  uint64_t add(Fn fn) {
    hooks_.emplace_back(next_id_, std::move(fn));
    return next_id_++;
  }
  void remove(uint64_t id) override {
    for (auto& [hook_id, fn] : hooks_)
      if (hook_id == id) fn = nullptr;  // a tombstone while run() is iterating
    if (running_ == 0) compact();
  }
  void run(Args... args) {
    struct Running {
      HookListOf& list;
      explicit Running(HookListOf& l) : list(l) { ++list.running_; }
      ~Running() {
        if (--list.running_ == 0) list.compact();
      }
    } running(*this);
    const size_t n = hooks_.size();
    for (size_t i = 0; i < n; ++i) {
      if (!hooks_[i].second) continue;  // removed by an earlier hook of this pass
      Fn fn = hooks_[i].second;         // a copy: the hook may remove itself
      fn(args...);
    }
  }
  size_t size() const { return hooks_.size(); }

 private:
  void compact() {
    hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(), [](const auto& h) { return !h.second; }),
                 hooks_.end());
  }
  std::vector<std::pair<uint64_t, Fn>> hooks_;  // (id, fn)
  uint64_t next_id_ = 0;
  int running_ = 0;  // nesting depth of run()
};
using HookList = HookListOf<Tensor&>;  // gradient hooks: fn(param)

// Owns one registered hook; destroying (or remove()-ing) it unregisters the
// hook. Move-only: moving hands the registration on.
class [[nodiscard]] RemovableHandle {
 public:
  RemovableHandle() = default;
  // keep_alive: what must live for the hook to keep firing (an AccumulateGrad
  // node, which its param's meta holds only weakly); null for none.
  RemovableHandle(const std::shared_ptr<HookListBase>& hooks, uint64_t id, std::shared_ptr<void> keep_alive = nullptr)
      : hooks_(hooks), id_(id), keep_alive_(std::move(keep_alive)) {}
  ~RemovableHandle() { remove(); }
  RemovableHandle(RemovableHandle&& other) noexcept { *this = std::move(other); }
  RemovableHandle& operator=(RemovableHandle&& other) noexcept {
    if (this != &other) {
      remove();
      hooks_ = std::exchange(other.hooks_, {});
      id_ = other.id_;
      keep_alive_ = std::exchange(other.keep_alive_, nullptr);
    }
    return *this;
  }
  RemovableHandle(const RemovableHandle&) = delete;
  RemovableHandle& operator=(const RemovableHandle&) = delete;

  // Unregisters the hook (a no-op once done, or for a moved-from handle).
  void remove() {
    if (auto hooks = hooks_.lock()) hooks->remove(id_);
    hooks_.reset();
    keep_alive_ = nullptr;
  }
  bool active() const { return !hooks_.expired(); }

 private:
  std::weak_ptr<HookListBase> hooks_;
  uint64_t id_ = 0;
  std::shared_ptr<void> keep_alive_;
};

}  // namespace loom::autograd
