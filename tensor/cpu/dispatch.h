// Internal to tensor/: dtype dispatch and fp32 compute conversions for the CPU loops.
// A float op is written once on `scalar_t` (the storage type) and `acc_t` (the
// compute type: double for float64, float for everything else).
#pragma once

#include <type_traits>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace loom::cpu {

inline float to_acc(bfloat16 v) { return bf16_to_float(v); }
inline float to_acc(float16 v) { return fp16_to_float(v); }
inline float to_acc(float v) { return v; }
inline double to_acc(double v) { return v; }
inline double to_acc(int32_t v) { return double(v); }
inline double to_acc(int64_t v) { return double(v); }

template <class T> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };
template <> struct acc_type<int32_t> { using type = double; };
template <> struct acc_type<int64_t> { using type = double; };

template <class T, class A>
inline T from_acc(A v) {
  if constexpr (std::is_same_v<T, bfloat16>) return float_to_bf16(float(v));
  else if constexpr (std::is_same_v<T, float16>) return float_to_fp16(float(v));
  else return static_cast<T>(v);
}

}  // namespace loom::cpu

#define LOOM_DTYPE_CASE(DT, T, ...) \
  case ::loom::DType::DT: {         \
    using scalar_t = T;             \
    using acc_t [[maybe_unused]] = typename ::loom::cpu::acc_type<T>::type; \
    __VA_ARGS__;                    \
    break;                          \
  }

// Runs the body with scalar_t/acc_t bound for the four floating dtypes.
#define LOOM_DISPATCH_FLOAT(dtype, op, ...)                                                   \
  switch (dtype) {                                                                             \
    LOOM_DTYPE_CASE(Float64, double, __VA_ARGS__)                                              \
    LOOM_DTYPE_CASE(Float32, float, __VA_ARGS__)                                               \
    LOOM_DTYPE_CASE(BFloat16, ::loom::bfloat16, __VA_ARGS__)                                   \
    LOOM_DTYPE_CASE(Float16, ::loom::float16, __VA_ARGS__)                                     \
    default:                                                                                   \
      throw ::loom::Error(::loom::str(op, ": dtype ", ::loom::dtype_name(dtype), " is not supported (floating dtypes only)")); \
  }

#define LOOM_DISPATCH_ALL(dtype, op, ...)                     \
  switch (dtype) {                                            \
    LOOM_DTYPE_CASE(Float64, double, __VA_ARGS__)             \
    LOOM_DTYPE_CASE(Float32, float, __VA_ARGS__)              \
    LOOM_DTYPE_CASE(BFloat16, ::loom::bfloat16, __VA_ARGS__)  \
    LOOM_DTYPE_CASE(Float16, ::loom::float16, __VA_ARGS__)    \
    LOOM_DTYPE_CASE(Int32, int32_t, __VA_ARGS__)              \
    LOOM_DTYPE_CASE(Int64, int64_t, __VA_ARGS__)              \
  }

// For data already in a compute dtype (float64 or float32).
#define LOOM_DISPATCH_COMPUTE(dtype, op, ...)                                                 \
  switch (dtype) {                                                                             \
    LOOM_DTYPE_CASE(Float64, double, __VA_ARGS__)                                              \
    LOOM_DTYPE_CASE(Float32, float, __VA_ARGS__)                                               \
    default:                                                                                   \
      throw ::loom::Error(::loom::str(op, ": internal error: expected float32/float64 data, got ", ::loom::dtype_name(dtype))); \
  }
