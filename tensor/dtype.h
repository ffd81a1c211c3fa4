// Element types. float64 exists for gradient checks; float32 is the compute
// type; bfloat16/float16 are storage types for mixed precision; int32/int64
// hold token ids and indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/kernels/half.h"

namespace loom {

enum class DType : uint8_t { Float64, Float32, BFloat16, Float16, Int32, Int64 };

constexpr DType kFloat64 = DType::Float64;
constexpr DType kFloat32 = DType::Float32;
constexpr DType kBFloat16 = DType::BFloat16;
constexpr DType kFloat16 = DType::Float16;
constexpr DType kInt32 = DType::Int32;
constexpr DType kInt64 = DType::Int64;

size_t element_size(DType t);
const char* dtype_name(DType t);  // "float32", "bfloat16", ...
DType dtype_from_name(const std::string& name);
inline bool is_floating(DType t) { return t <= DType::Float16; }
inline bool is_half(DType t) { return t == DType::BFloat16 || t == DType::Float16; }
inline bool is_integer(DType t) { return t == DType::Int32 || t == DType::Int64; }

// C++ type -> DType, for typed accessors (data<float>(), from_vector<int64_t>).
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<double>() { return DType::Float64; }
template <> constexpr DType dtype_of<float>() { return DType::Float32; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::BFloat16; }
template <> constexpr DType dtype_of<float16>() { return DType::Float16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::Int32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::Int64; }

}  // namespace loom
