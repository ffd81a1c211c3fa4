// libFuzzer target: data::BpeTokenizer::from_file on arbitrary bytes (a
// tokenizer.json from a stranger's model folder). It must throw loom::Error
// naming the file, or give a tokenizer that encodes a fixed text to ids inside
// its vocabulary (or refuses that text with loom::Error) - never crash, overflow
// or throw anything else.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "data/bpe_tokenizer.h"
#include "fuzz/fuzz_input.h"
#include "tensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = loom::fuzz::write_input("tokenizer.json", data, size);
  try {
    const loom::data::BpeTokenizer t = loom::data::BpeTokenizer::from_file(in);
    for (int32_t id : t.encode("Hello, wörld! 12 3\n"))
      if (id < 0 || id >= t.vocab_size()) {
        std::fprintf(stderr, "tokenizer: id %d outside the vocabulary of %lld\n", id, (long long)t.vocab_size());
        std::abort();
      }
  } catch (const loom::Error&) {
    return 0;  // refused with a message: fine
  }
  return 0;
}
