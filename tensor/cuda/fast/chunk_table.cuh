// Internal to tensor/cuda/fast/: the one upload a multi-tensor launch makes.
// The host lays out [chunk table | per-tensor slots | tail] in one buffer and
// copies it to the GPU in one transfer (no launch: transfers are not counted,
// tensor/cuda/launch_count.h); the tail is zeroed on the host, so a flag the
// kernel sets (found_inf) starts at 0 without a memset launch. The buffer lives
// in the caching allocator, freed stream-ordered after the kernels that read it.
#pragma once

#include <cstring>
#include <vector>

#include "tensor/cuda/launch.cuh"
#include "tensor/cuda/pinned.h"
#include "tensor/kernels/tensor_chunks.h"

namespace loom::cuda {

struct ChunkTable {
  Tensor buffer;                        // int32 [bytes / 4], on the GPU
  const kernels::TensorChunk* chunks;   // [chunks]
  const void* slots;                    // [tensors] Slot
  int64_t tail_index;                   // the tail's first int32 element of `buffer`
};

inline size_t round_up16(size_t n) { return (n + 15) / 16 * 16; }

template <class Slot>
ChunkTable upload_chunk_table(const std::vector<kernels::TensorChunk>& chunks, const std::vector<Slot>& slots,
                              size_t tail_bytes, const Device& d) {
  LOOM_CHECK(chunks.size() <= size_t(INT32_MAX), "multi-tensor launch: ", chunks.size(), " chunks (a block each)");
  const size_t chunk_bytes = round_up16(chunks.size() * sizeof(kernels::TensorChunk));
  const size_t slot_bytes = round_up16(slots.size() * sizeof(Slot));
  const size_t bytes = chunk_bytes + slot_bytes + round_up16(tail_bytes);
  std::vector<char> host(bytes, 0);
  std::memcpy(host.data(), chunks.data(), chunks.size() * sizeof(kernels::TensorChunk));
  std::memcpy(host.data() + chunk_bytes, slots.data(), slots.size() * sizeof(Slot));
  ChunkTable t;
  t.buffer = empty({int64_t(bytes / 4)}, kInt32, d);
  upload(t.buffer.raw_data(), host.data(), bytes, d);
  const char* base = static_cast<const char*>(t.buffer.raw_data());
  t.chunks = reinterpret_cast<const kernels::TensorChunk*>(base);
  t.slots = base + chunk_bytes;
  t.tail_index = int64_t((chunk_bytes + slot_bytes) / 4);
  return t;
}

}  // namespace loom::cuda
