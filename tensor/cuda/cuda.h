// The CUDA backend's public switches and counters (a CUDA build only; each
// function throws "loom was built without CUDA" in a build without it).
// Tensors reach the GPU through the ordinary API: empty(shape, dtype, "cuda:0"),
// ops::to(t, Device("cuda")), and every op dispatches on its inputs' device.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/device.h"

namespace loom::cuda {

// GPUs the CUDA runtime sees (0 without a GPU or driver; never throws).
int device_count();
bool is_available();
// Why no GPU can be used ("" when one can): the runtime's answer
// ("cudaGetDeviceCount: no CUDA-capable device is detected (cudaErrorNoDevice)"),
// or that this build has no CUDA. For messages such as train_gpt's --device check.
std::string unavailable_reason();

// Waits until everything loom enqueued on d's stream has finished. Copies to
// the CPU and .item() do this themselves; benchmarks call it before a clock.
void synchronize(const Device& d);

// A kernel that meets a bad index (an embedding row, a cross-entropy target)
// records it, and the next copy to the CPU on any thread reports it. The MPI
// backend's staging copies (parallel/comm) run on its communication thread,
// where the error would surface as a failed collective and be gone from the
// compute thread's next .item(). While one of these lives on a thread, that
// thread's copies to the CPU leave the record for the next one elsewhere.
class DeferIndexErrors {
 public:
  DeferIndexErrors();
  ~DeferIndexErrors();
  DeferIndexErrors(const DeferIndexErrors&) = delete;
  DeferIndexErrors& operator=(const DeferIndexErrors&) = delete;
  static bool active();  // on this thread

 private:
  bool saved_;
};

// Timestamps on the GPU's clock, for the trace's GPU tracks
// (parallel/trace/trace.h). A timing event recorded on a stream completes
// when the GPU reaches it, so two of them bracket the work enqueued between
// them: when it ran, not when the host launched it.
struct TimingEvent {
  void* event = nullptr;  // a cudaEvent_t; null: none
  int device = -1;
};
// Recorded on loom's stream of d, or on `stream` (a cudaStream_t of d, e.g.
// an NCCL group's) when given.
TimingEvent record_timing_event(const Device& d, void* stream = nullptr);
// Milliseconds from a to b on the GPU's clock (negative when b came first).
// Waits until both have completed; both must be events of one device.
double elapsed_ms(const TimingEvent& a, const TimingEvent& b);
// Gives the event back (nothing for an empty one); e is left empty.
void destroy_timing_event(TimingEvent& e);

// TF32 tensor-core GEMMs (10-bit mantissa inputs, fp32 accumulation): faster,
// but a GPU run then no longer matches the CPU run. Off by default (--tf32).
void set_allow_tf32(bool allow);
bool allow_tf32();

// The caching allocator's own counters for one device (tensor/cuda/allocator.h).
// Live and peak tensor bytes are memory_stats(d), as for the CPU.
struct AllocatorStats {
  int64_t reserved_bytes = 0;  // held from cudaMalloc: live blocks + cached free blocks
  int64_t cached_bytes = 0;    // free blocks kept for reuse
  int64_t device_allocs = 0;   // cudaMalloc calls so far (flat in a steady-state step)
  int64_t device_frees = 0;    // cudaFree calls so far (only empty_cache and out-of-memory retries)
  int64_t pinned_allocs = 0;   // cudaHostAlloc calls for uploads' staging (flat in a steady-state step)
};
AllocatorStats allocator_stats(const Device& d);
// Gives every cached free block of d back to the driver (cudaFree).
void empty_cache(const Device& d);

}  // namespace loom::cuda
