// libFuzzer target: nn::read_hf_config on arbitrary bytes (a config.json from a
// stranger's model folder). It must throw loom::Error naming the file, or return
// a config that loom writes back (hf_config_json) and reads again to the same
// config - never crash, overflow or throw anything else (a JSON library's own
// type error is a crash here: the message must name the file and the key).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_input.h"
#include "nn/hf_config.h"
#include "tensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = loom::fuzz::write_input("config.json", data, size);
  loom::nn::GPTConfig cfg;
  try {
    cfg = loom::nn::read_hf_config(in);
  } catch (const loom::Error&) {
    return 0;  // refused with a message: fine
  }
  const std::string text = loom::nn::hf_config_json(cfg, loom::kFloat32);
  const std::string again =
      loom::fuzz::write_input("again.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  if (loom::nn::hf_config_json(loom::nn::read_hf_config(again), loom::kFloat32) != text) {
    std::fprintf(stderr, "hf_config: a config read did not survive write + read unchanged\n");
    std::abort();
  }
  return 0;
}
