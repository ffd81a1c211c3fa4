// Internal to tensor/cuda/fast/flash_attention_mma*.cu: the two device pieces
// the tensor-core attention's forward and backward share, the instruction
// itself and the load of a tile of 16-bit rows into shared memory. Which lane
// holds which element of an operand: tensor/kernels/mma_fragment.h.
#pragma once

#include <type_traits>

#include "tensor/cuda/fast/flash_tiles.cuh"

namespace loom::cuda::flash {

// d += a b on the tensor cores: one m16n8k16 with fp32 accumulators
// (a: 16 x 16, b: 16 x 8, both bf16 or fp16 as S says; d: 16 x 8 fp32).
template <class S>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<S, bfloat16>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Rows [row0, row0 + N) of one head into tile [N][LD] as raw 16-bit values,
// 16 bytes per load (HD a multiple of 8, rows on 16-byte boundaries); rows
// at or past T as zeros.
template <int N, int HD, int LD, class S>
__device__ __forceinline__ void load_tile_bits(uint16_t* tile, const Heads<const S>& x, int b, int h, int row0, int T) {
  constexpr int kVectors = HD / 8;  // per row
  for (int e = threadIdx.x; e < N * kVectors; e += blockDim.x) {
    const int r = e / kVectors, c = e % kVectors * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) val = *reinterpret_cast<const uint4*>(x.row(b, h, row0 + r) + c);
    *reinterpret_cast<uint4*>(tile + r * LD + c) = val;
  }
}

// Whether every row of a [B, H, T, hd] tensor (16-bit elements) starts on a
// 16-byte boundary and is contiguous: what load_tile_bits's loads need.
inline bool rows_aligned16(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
         t.stride(2) % 8 == 0 && t.stride(3) == 1;
}

}  // namespace loom::cuda::flash
