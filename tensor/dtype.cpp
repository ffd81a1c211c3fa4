#include "tensor/dtype.h"

#include "tensor/error.h"

namespace loom {

size_t element_size(DType t) {
  switch (t) {
    case DType::Float64: return 8;
    case DType::Float32: return 4;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float64: return "float64";
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "float64" || n == "fp64") return DType::Float64;
  if (n == "float32" || n == "fp32") return DType::Float32;
  if (n == "bfloat16" || n == "bf16") return DType::BFloat16;
  if (n == "float16" || n == "fp16") return DType::Float16;
  if (n == "int32") return DType::Int32;
  if (n == "int64") return DType::Int64;
  throw Error(str("unknown dtype '", n, "' (expected float64, float32, bfloat16, float16, int32 or int64)"));
}

}  // namespace loom
