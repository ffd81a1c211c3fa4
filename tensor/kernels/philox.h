// Philox4x32-10, the counter-based generator of Random123 (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC 2011) and of PyTorch's
// CUDA generator: 4 random 32-bit words are a pure function of a 128-bit
// counter and a 64-bit key, ten rounds of multiply / xor / key bump. No state
// is carried from one draw to the next, so any thread can draw any element,
// and the CPU loop and the CUDA kernel draw the same bits for it.
//
// Dropout uses it as: key = the layer's seed, counter = (element block i / 4,
// call number `offset`); element i keeps word i % 4 of that block.
#pragma once

#include <cstdint>

#include "tensor/macros.h"

namespace loom::kernels {

struct Philox4 {
  uint32_t w[4];
};

// (hi, lo) of the 64-bit product a * b.
LOOM_HOST_DEVICE void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

// ctr: 4 counter words, key: 2 key words (Random123's philox4x32_R(10, ctr, key)).
LOOM_HOST_DEVICE Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key bumps: golden ratio, sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kM0, ctr.w[0], hi0, lo0);
    mulhilo32(kM1, ctr.w[2], hi1, lo1);
    ctr = Philox4{{hi1 ^ ctr.w[1] ^ k0, lo1, hi0 ^ ctr.w[3] ^ k1, lo0}};
  }
  return ctr;
}

// The 4 words of block `block` (elements 4*block .. 4*block+3) of call `offset` under `seed`.
LOOM_HOST_DEVICE Philox4 philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  return philox4x32_10(Philox4{{uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// Dropout's keep decision for a 32-bit draw: kept when draw >= threshold, with
// threshold = dropout_threshold(p) = floor(p * 2^32) computed once on the host,
// so P(keep) = 1 - threshold / 2^32 and no float rounding differs between devices.
LOOM_HOST_DEVICE bool dropout_keeps(uint32_t draw, uint32_t threshold) { return draw >= threshold; }

inline uint32_t dropout_threshold(double p) {
  const double t = p * 4294967296.0;  // p in [0, 1): t < 2^32
  return t >= 4294967295.0 ? 0xFFFFFFFFu : uint32_t(t);
}

}  // namespace loom::kernels
