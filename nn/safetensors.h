// Checkpoints in the safetensors format (huggingface/safetensors), so a loom
// model loads in PyTorch and back:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  JSON: {"<name>": {"dtype": "F32", "shape": [2, 3],
//                                "data_offsets": [begin, end]}, ...,
//                     "__metadata__": {"<key>": "<string value>", ...}}
//              (a non-string metadata value another writer put there, such as
//              true, false, null or 3, loads as its JSON text: "true", "null", "3")
//              padded with spaces so that the data starts 8-byte aligned
//   [rest]     the tensors' raw little-endian bytes, row-major; offsets are
//              relative to the start of this buffer
//
// dtypes: F64, F32, BF16, F16, I32, I64. A save writes `path.tmp` and renames
// it over `path`, so a crash never leaves a half-written checkpoint. A load
// checks everything it reads and names the file and the tensor in its errors.
#pragma once

#include <map>
#include <string>

#include "nn/module.h"

namespace loom::nn {

struct SafetensorsFile {
  std::string path;
  NamedTensors tensors;                         // in the order of the JSON header
  std::map<std::string, std::string> metadata;  // "__metadata__"

  bool contains(const std::string& name) const;
  const Tensor& at(const std::string& name) const;  // error naming the file and tensor if absent
};

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

SafetensorsFile load_safetensors(const std::string& path);

// The safetensors name of a dtype: kFloat32 -> "F32", kBFloat16 -> "BF16", ...
std::string safetensors_dtype(DType dtype);

}  // namespace loom::nn
