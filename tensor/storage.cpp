#include "tensor/profile.h"
#include "tensor/storage.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>

#include "tensor/error.h"
#ifdef LOOM_WITH_CUDA
#include "tensor/cuda/allocator.h"
#endif

namespace loom {
namespace {

constexpr int kMaxDevices = 17;  // cpu + up to 16 GPUs
std::mutex g_mutex;
MemoryStats g_stats[kMaxDevices];

int slot(const Device& d) { return d.is_cpu() ? 0 : 1 + (d.index % (kMaxDevices - 1)); }

// A training step frees and reallocates the same activation-sized blocks
// (hundreds of KB to MB) every step. glibc's defaults serve such blocks with
// fresh mmaps, or give freed heap tops back to the kernel, so every step would
// page-fault its activations in again (~6k faults per small-GPT step, a few
// ms). Keeping them in the heap (up to the largest mmap threshold glibc
// allows, 32 MB) and never trimming makes a step reuse the previous step's
// pages. Set once, before the first allocation through this file.
const bool g_malloc_tuned = [] {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}();

void record_alloc(const Device& d, int64_t n) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_stats[slot(d)];
  s.live_bytes += n;
  s.num_allocs += 1;
  if (s.live_bytes > s.peak_bytes) s.peak_bytes = s.live_bytes;
}

void record_free(const Device& d, int64_t n) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_stats[slot(d)].live_bytes -= n;
}

}  // namespace

MemoryStats memory_stats(const Device& d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats[slot(d)];
}

void reset_peak_memory_stats(const Device& d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_stats[slot(d)];
  s.peak_bytes = s.live_bytes;
}

Storage::Storage(size_t nbytes, const Device& device) : nbytes_(nbytes), device_(device) { allocate_bytes(); }

Storage::~Storage() { free_bytes(); }

void Storage::release() {
  if (data_) free_bytes();
}

void Storage::allocate() {
  if (!data_) allocate_bytes();
}

void Storage::allocate_bytes() {
  profile::Scope prof("allocate", 0, double(nbytes_));
#ifdef LOOM_WITH_CUDA
  if (device_.is_cuda()) {  // the caching allocator (cuda/allocator.h); throws a loom::Error when out of memory
    data_ = cuda::allocate(nbytes_, device_);
    record_alloc(device_, int64_t(nbytes_));
    return;
  }
#endif
  check_device_supported("allocate", device_);
  // 64-byte alignment: AVX-512 loads and BLAS like it. Not aligned_alloc: for
  // small blocks glibc's memalign bypasses its per-thread cache and splits
  // chunks, which made allocation the largest cost of a small op. Instead take
  // 64 spare bytes from malloc (16-aligned), align inside them, and keep the
  // malloc pointer in the 8 bytes just below the aligned block.
  size_t padded = (nbytes_ + 63) / 64 * 64;
  if (padded == 0) padded = 64;
  void* raw = std::malloc(padded + 64);
  if (!raw) throw std::bad_alloc();  // empty() names the tensor's shape, dtype and the live bytes
  uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + 64) & ~uintptr_t(63);
  data_ = reinterpret_cast<void*>(aligned);
  reinterpret_cast<void**>(data_)[-1] = raw;
  record_alloc(device_, int64_t(nbytes_));
}

void Storage::free_bytes() {
  profile::Scope prof("free", 0, 0);
  if (!data_) return;  // released
#ifdef LOOM_WITH_CUDA
  if (device_.is_cuda()) {
    cuda::deallocate(data_, nbytes_, device_);
    record_free(device_, int64_t(nbytes_));
    data_ = nullptr;
    return;
  }
#endif
  std::free(reinterpret_cast<void**>(data_)[-1]);
  record_free(device_, int64_t(nbytes_));
  data_ = nullptr;
}

}  // namespace loom
