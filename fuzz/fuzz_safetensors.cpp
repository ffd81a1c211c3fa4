// libFuzzer target: nn::load_safetensors on arbitrary bytes. The reader must
// either throw loom::Error or return tensors that are what the file says -
// never crash, overflow a buffer or allocate what the file does not hold. A
// file that loads must survive a save and a second load unchanged, byte for
// byte (names, order, dtypes, shapes, data, metadata).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nn/safetensors.h"
#include "tensor/error.h"

namespace {

// One scratch file per process (the reader takes a path).
std::string scratch(const char* suffix) {
  return std::string("/tmp/loom_fuzz_safetensors_") + std::to_string(getpid()) + suffix;
}

void same_or_die(const loom::nn::SafetensorsFile& a, const loom::nn::SafetensorsFile& b) {
  bool same = a.metadata == b.metadata && a.tensors.size() == b.tensors.size();
  for (size_t i = 0; same && i < a.tensors.size(); ++i) {
    const auto& [na, ta] = a.tensors[i];
    const auto& [nb, tb] = b.tensors[i];
    same = na == nb && ta.dtype() == tb.dtype() && ta.shape() == tb.shape() && ta.nbytes() == tb.nbytes() &&
           std::memcmp(ta.raw_data(), tb.raw_data(), ta.nbytes()) == 0;
  }
  if (!same) {
    std::fprintf(stderr, "safetensors: a loaded file did not survive save + load unchanged\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string in = scratch(".in"), out = scratch(".out");
  FILE* f = std::fopen(in.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  loom::nn::SafetensorsFile loaded;
  try {
    loaded = loom::nn::load_safetensors(in);
  } catch (const loom::Error&) {
    return 0;  // rejected with a message: fine
  }
  loom::nn::save_safetensors(out, loaded.tensors, loaded.metadata);
  same_or_die(loaded, loom::nn::load_safetensors(out));
  return 0;
}
