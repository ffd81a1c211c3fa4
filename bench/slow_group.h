// SlowProcessGroup: a process group whose every operation takes `delay` longer
// - a slow network simulated on one machine, where the real collectives of a
// small model take microseconds and would hide what an overlap is worth. The
// inner group runs each operation at once (so every rank still issues the
// same operations in the same order); the Work handed back completes only
// after this group's own FIFO thread has also slept `delay` for it, one
// operation after another, as on a link that carries one message at a time.
// For benchmarks only (bench/pipeline_grad_sync.cpp, bench/zero_param_gather.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "parallel/comm/comm_queue.h"
#include "parallel/comm/process_group.h"

namespace loom::bench {

class SlowProcessGroup : public parallel::ProcessGroup {
 public:
  SlowProcessGroup(parallel::ProcessGroup& inner, std::chrono::microseconds delay)
      : inner_(inner), delay_(delay), queue_("slow " + inner.name()) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }

  std::shared_ptr<parallel::Work> all_reduce_async(const Tensor& t, parallel::ReduceOp op) override {
    return slow("all_reduce", inner_.all_reduce_async(t, op));
  }
  std::shared_ptr<parallel::Work> reduce_scatter_async(const Tensor& out, const Tensor& in,
                                                       parallel::ReduceOp op) override {
    return slow("reduce_scatter", inner_.reduce_scatter_async(out, in, op));
  }
  std::shared_ptr<parallel::Work> all_gather_async(const Tensor& out, const Tensor& in) override {
    return slow("all_gather", inner_.all_gather_async(out, in));
  }
  std::shared_ptr<parallel::Work> broadcast_async(const Tensor& t, int root) override {
    return slow("broadcast", inner_.broadcast_async(t, root));
  }
  std::shared_ptr<parallel::Work> send_async(const Tensor& t, int dst, int tag) override {
    return slow("send", inner_.send_async(t, dst, tag));
  }
  std::shared_ptr<parallel::Work> recv_async(const Tensor& t, int src, int tag) override {
    return slow("recv", inner_.recv_async(t, src, tag));
  }
  std::shared_ptr<parallel::Work> barrier_async() override { return slow("barrier", inner_.barrier_async()); }
  std::unique_ptr<parallel::ProcessGroup> split(int color, int key, const std::string& name) override {
    return inner_.split(color, key, name);  // not slowed
  }

 private:
  std::shared_ptr<parallel::Work> slow(const char* op, std::shared_ptr<parallel::Work> work) {
    return queue_.submit(op, 0, [work, d = delay_] {
      std::this_thread::sleep_for(d);
      work->wait();
    });
  }

  parallel::ProcessGroup& inner_;
  std::chrono::microseconds delay_;
  parallel::CommQueue queue_;
};

}  // namespace loom::bench
