// bfloat16 and float16 storage types and their conversions to/from float.
// Storage only: math converts to fp32, computes, and rounds the result back
// with round-to-nearest-even (the same contract as cuBLAS GemmEx with fp32
// accumulation). Host/device so CUDA kernels can use the same conversions.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__F16C__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>  // x86 F16C: one instruction per conversion (-march=native)
#endif

#include "tensor/macros.h"

namespace loom {

struct bfloat16 { uint16_t bits; };
struct float16 { uint16_t bits; };

LOOM_HOST_DEVICE uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
LOOM_HOST_DEVICE float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// bf16 is the top 16 bits of an fp32; round the dropped 16 bits to nearest even.
LOOM_HOST_DEVICE bfloat16 float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x0040u)};  // NaN stays NaN (quiet)
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return {uint16_t(u >> 16)};
}
LOOM_HOST_DEVICE float bf16_to_float(bfloat16 h) { return bits_float(uint32_t(h.bits) << 16); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
LOOM_HOST_DEVICE float16 float_to_fp16(float f) {
#if defined(__F16C__) && !defined(__CUDA_ARCH__)
  // The same rounding in hardware; a NaN keeps its sign and payload, quieted.
  if (f == f) return {uint16_t(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT))};
#endif
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};      // NaN
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};     // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                       // below 2^-14: subnormal half
    // value = a_float; half subnormal unit is 2^-24. Round-to-nearest-even of a / 2^-24.
    if (a < 0x33000000u) return {sign};                        // < 2^-25: rounds to zero
    uint32_t exp = a >> 23;                                    // biased fp32 exponent
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;               // 24-bit significand
    uint32_t shift = 126 - exp;                                // so that result = mant >> (shift + ...)
    // a = mant * 2^(exp-150); in units of 2^-24: mant * 2^(exp-126) = mant >> (126-exp)
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return {uint16_t(sign | q)};
  }
  // normal: rebias exponent (127 -> 15) and round 13 dropped mantissa bits to nearest even
  uint32_t lsb = (a >> 13) & 1u;
  a += 0xfffu + lsb;
  uint32_t h = ((a >> 13) - (112u << 10));
  return {uint16_t(sign | h)};
}

LOOM_HOST_DEVICE float fp16_to_float(float16 h) {
#if defined(__F16C__) && !defined(__CUDA_ARCH__)
  return _cvtsh_ss(h.bits);
#endif
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    float v = float(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace loom
