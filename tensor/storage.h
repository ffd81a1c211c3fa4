// Storage: one reference-counted block of bytes on a device, shared by a
// tensor and all of its views. Allocations go through a counting allocator so
// that live and peak bytes per device are numbers a test can check (ZeRO's
// memory saving is measured, not claimed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/device.h"

namespace loom {

struct MemoryStats {
  int64_t live_bytes = 0;   // bytes currently allocated
  int64_t peak_bytes = 0;   // max live_bytes since start or the last reset_peak
  int64_t num_allocs = 0;   // allocations made so far
};

// Counters per device (thread-safe: communication threads allocate too).
MemoryStats memory_stats(const Device& d = kCPU);
void reset_peak_memory_stats(const Device& d = kCPU);

class Storage {
 public:
  Storage(size_t nbytes, const Device& device);  // uninitialised bytes
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }

  // Frees the bytes while the Storage object - and every tensor and view that
  // shares it - stays (PyTorch FSDP's storage.resize_(0)): ZeRO-3 keeps a
  // unit's params as views of a flat buffer that exists only while gathered.
  // allocate() gives it nbytes() uninitialised bytes again, at some address;
  // tensors find it through data() (a tensor never caches the pointer).
  void release();
  void allocate();
  bool is_allocated() const { return data_ != nullptr; }

 private:
  void allocate_bytes();
  void free_bytes();
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
};

}  // namespace loom
