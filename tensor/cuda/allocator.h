// Internal to tensor/: the caching allocator behind every CUDA Storage.
//
// cudaMalloc and cudaFree are slow (cudaFree also synchronises the device), and
// a training step frees and reallocates the same activation-sized blocks every
// step. So a freed block is not given back: it goes on a free list keyed by its
// rounded size, and the next request of that size takes it (PyTorch's
// CUDACachingAllocator, without block splitting). After the first step every
// request is served from the lists: no cudaMalloc or cudaFree in steady state
// (tests/cuda/test_cuda_allocator.cpp counts them).
//
// Stream-ordered: all of loom's work on a device runs on its one stream
// (context.h), so a block freed after op A was enqueued can be handed to op B
// at once: B's kernels run after A's on that stream. The one other stream,
// an NCCL group's, keeps that true by holding its tensors until loom's stream
// has been made to wait for the operation (process_group_nccl.h).
//
// Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, so nearby sizes
// share a list:
//   request 1000 B -> block 1024 B;  3 MB -> 4 MiB;  (0 B -> no block, nullptr)
#pragma once

#include <cstddef>

#include "tensor/device.h"

namespace loom::cuda {

size_t rounded_block_size(size_t nbytes);

// A block of at least nbytes on d. On out of memory the cached free blocks are
// released and the cudaMalloc retried once; if it still fails, a loom::Error
// names the bytes requested, the device, its free and total memory, and what
// loom holds (live tensor bytes, reserved bytes).
void* allocate(size_t nbytes, const Device& d);
// Returns the block (from allocate with the same nbytes) to d's free list.
void deallocate(void* ptr, size_t nbytes, const Device& d);

}  // namespace loom::cuda
