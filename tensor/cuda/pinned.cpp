#include "tensor/cuda/pinned.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "tensor/cuda/allocator.h"
#include "tensor/cuda/check.h"
#include "tensor/cuda/context.h"

namespace loom::cuda {
namespace {

constexpr int kMaxDevices = 16;

struct PinnedBlock {
  void* host = nullptr;
  size_t size = 0;
  cudaEvent_t copied = nullptr;  // recorded after the last DMA out of this block
};

struct PinnedPool {
  std::vector<PinnedBlock> blocks;  // a few dozen at most: a step's batches and buckets
  int64_t allocs = 0;
};

std::mutex g_mutex;
// Never destroyed: the pinned blocks live until the process ends.
PinnedPool* const g_pools = new PinnedPool[kMaxDevices];

// A block of `size` whose last DMA has finished, or a new one (caller holds
// g_mutex, d current). A fresh event reports complete: never recorded.
PinnedBlock& take(PinnedPool& pool, size_t size) {
  for (PinnedBlock& b : pool.blocks)
    if (b.size == size && query_event(b.copied) == cudaSuccess) return b;
  PinnedBlock b;
  b.size = size;
  CUDA_CHECK(cudaHostAlloc(&b.host, size, cudaHostAllocDefault));
  const cudaError_t e = cudaEventCreateWithFlags(&b.copied, cudaEventDisableTiming);
  if (e != cudaSuccess) (void)cudaFreeHost(b.host);
  CUDA_CHECK(e);
  pool.blocks.push_back(b);
  pool.allocs += 1;
  return pool.blocks.back();
}

}  // namespace

void upload(void* dst, const void* src, size_t nbytes, const Device& d) {
  DeviceGuard guard(d);
  cudaStream_t s = stream(d);
  if (nbytes > kMaxPinnedUpload) {  // pageable: waits for the stream, then copies
    CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s));
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  PinnedBlock& b = take(g_pools[d.index], rounded_block_size(nbytes));
  std::memcpy(b.host, src, nbytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, b.host, nbytes, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaEventRecord(b.copied, s));
}

int64_t pinned_allocs(const Device& d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_pools[d.index].allocs;
}

}  // namespace loom::cuda
