// Internal to tensor/: the per-device state every CUDA op uses.
//
// One compute stream per device (DESIGN.md): every kernel, cuBLAS call and
// copy loom makes on cuda:N is enqueued on stream(N), in program order. That
// order is what makes the caching allocator safe without events: a block
// freed by one op and handed to the next is only touched by kernels that run
// after the first op's kernels on the same stream. The host waits for the
// stream only where a value must reach it (copies to the CPU, .item()).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tensor/device.h"

namespace loom::cuda {

// Throws a loom::Error unless d names a GPU this process can use: with no GPU
// (or no driver) the message says so; past the last GPU it names how many exist.
void check_device(const Device& d);

// Makes d the current CUDA device for its lifetime, restoring the previous one.
// A thread's first guard sets d once and restores nothing: a thread that never
// chose a device has none to go back to (cudaGetDevice's 0 is only the
// default), so each rank's threads stay on the rank's GPU and none touches GPU 0.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

cudaStream_t stream(const Device& d);          // loom's one stream on d (created on first use)
cublasHandle_t cublas_handle(const Device& d);  // bound to stream(d)

// A bad index met by a kernel (an embedding row, a cross-entropy target). A
// kernel cannot throw, and checking indices on the host would mean waiting for
// the GPU, so the first bad index is claimed here (device memory: atomicCAS on
// the op field) and the next synchronisation with the host - a copy to the
// CPU, .item(), synchronize() - copies the record down and throws it:
//   "embedding: index 70 out of range for 65 rows (found on cuda:0 by a kernel)"
// The kernel itself writes zeros (or skips the row) for a bad index.
enum class IndexOp : int64_t {
  None = 0, Embedding, EmbeddingBackward, CrossEntropy, CrossEntropyBackward, IndexSelect, Gather, IndexAdd, ScatterAdd
};
struct IndexError {
  int64_t op;  // an IndexOp; None while no error
  int64_t index;
  int64_t limit;
};
IndexError* index_error_slot(const Device& d);  // device memory, zeroed on d's stream
// Before a synchronisation: enqueues the record's copy to the host on d's
// stream (nothing when no index-checking kernel ran on d).
void enqueue_index_error_copy(const Device& d);
// After it: throws the copied record, if any, and clears it on both sides.
void throw_if_index_error(const Device& d);

}  // namespace loom::cuda
