#include "tensor/cuda/allocator.h"

#include <map>
#include <mutex>
#include <vector>

#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/pinned.h"
#include "tensor/storage.h"

namespace loom::cuda {
namespace {

constexpr int kMaxDevices = 16;
constexpr size_t kSmallRound = 512;            // bytes
constexpr size_t kLargeRound = size_t(2) << 20;  // 2 MiB
constexpr size_t kSmallLimit = size_t(1) << 20;  // 1 MiB

struct DevicePool {
  std::map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks ready for reuse
  AllocatorStats stats;
};

std::mutex g_mutex;
// Never destroyed: a tensor held in a static may be freed after this file's
// statics are gone at exit.
DevicePool* const g_pools = new DevicePool[kMaxDevices];

// cudaFree of every cached block of one pool (caller holds g_mutex). Only
// on out of memory and empty_cache: cudaFree waits for the whole device,
// NCCL's streams included, so a collective still waiting for a peer would
// hold it (and every thread allocating) until that peer arrives - the
// caveat PyTorch's empty_cache has too. Not in a steady-state step.
void release_cached(DevicePool& pool, const Device& d) {
  DeviceGuard guard(d);
  for (auto& [size, blocks] : pool.free_blocks) {
    for (void* p : blocks) {
      CUDA_CHECK(cudaFree(p));  // synchronises the device: no kernel still uses p
      pool.stats.reserved_bytes -= int64_t(size);
      pool.stats.cached_bytes -= int64_t(size);
      pool.stats.device_frees += 1;
    }
  }
  pool.free_blocks.clear();
}

std::string mib(int64_t bytes) { return str(bytes, " bytes (", bytes / (1 << 20), " MiB)"); }

[[noreturn]] void throw_out_of_memory(size_t requested, size_t block, const Device& d, const DevicePool& pool) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
  throw Error(str("out of memory on ", d.str(), ": cannot allocate ", mib(int64_t(requested)), " (a block of ", block,
                  " bytes); the device has ", mib(int64_t(free_b)), " free of ", mib(int64_t(total_b)),
                  " total; loom holds ", mib(memory_stats(d).live_bytes), " in live tensors and ",
                  mib(pool.stats.reserved_bytes), " reserved by its caching allocator"));
}

}  // namespace

size_t rounded_block_size(size_t nbytes) {
  if (nbytes <= kSmallLimit) return (nbytes + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* allocate(size_t nbytes, const Device& d) {
  check_device(d);  // even for 0 bytes: without a GPU no CUDA tensor can be made
  if (nbytes == 0) return nullptr;
  const size_t block = rounded_block_size(nbytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  DevicePool& pool = g_pools[d.index];
  auto it = pool.free_blocks.find(block);
  if (it != pool.free_blocks.end() && !it->second.empty()) {  // steady state: reuse
    void* p = it->second.back();
    it->second.pop_back();
    pool.stats.cached_bytes -= int64_t(block);
    return p;
  }
  DeviceGuard guard(d);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, block);
  if (err == cudaErrorMemoryAllocation) {  // give the cache back and try once more
    (void)cudaGetLastError();
    release_cached(pool, d);
    err = cudaMalloc(&p, block);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw_out_of_memory(nbytes, block, d, pool);
    }
  }
  CUDA_CHECK(err);
  pool.stats.reserved_bytes += int64_t(block);
  pool.stats.device_allocs += 1;
  return p;
}

void deallocate(void* ptr, size_t nbytes, const Device& d) {
  if (!ptr) return;
  const size_t block = rounded_block_size(nbytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  DevicePool& pool = g_pools[d.index];
  pool.free_blocks[block].push_back(ptr);
  pool.stats.cached_bytes += int64_t(block);
}

AllocatorStats allocator_stats(const Device& d) {
  check_device(d);
  AllocatorStats stats;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    stats = g_pools[d.index].stats;
  }
  stats.pinned_allocs = pinned_allocs(d);
  return stats;
}

void empty_cache(const Device& d) {
  check_device(d);
  std::lock_guard<std::mutex> lock(g_mutex);
  release_cached(g_pools[d.index], d);
}

}  // namespace loom::cuda
