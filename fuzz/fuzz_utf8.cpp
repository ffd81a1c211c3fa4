// libFuzzer target: the UTF-8 side of train_gpt's data - decode_utf8 (the
// corpus reader's decoder) and the vocabulary a checkpoint stores. Bytes are
// either rejected with loom::Error or decoded to code points that encode back
// to exactly the same bytes (so only well-formed UTF-8 is accepted: no
// overlong forms, surrogates or code points past U+10FFFF). A vocabulary that
// loads maps every one of its characters to an id and back.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/data.h"
#include "tensor/error.h"

namespace {

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "utf8: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::u32string text;
  try {
    text = loom::data::decode_utf8(bytes, "fuzz");
  } catch (const loom::Error&) {
    return 0;
  }
  check(loom::data::encode_utf8(text) == bytes, "decode then encode changed the bytes");
  for (char32_t c : text) check(c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF), "decoded a non-scalar value");
  try {
    auto tok = loom::data::CharTokenizer::from_vocab_utf8(bytes);
    check(tok.vocab_size() == int64_t(text.size()), "vocabulary size is not its character count");
    check(tok.decode(tok.encode(text)) == bytes, "vocabulary: encode then decode changed the text");
  } catch (const loom::Error&) {
    // unsorted or repeated characters: rejected with a message
  }
  return 0;
}
