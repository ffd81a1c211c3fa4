// Characters or a BPE (notes in tokenizer.h).
#include "train/tokenizer.h"

namespace loom::train {

namespace {

const std::string kBpeRecord = "tokenizer.json ";  // + the file's fingerprint

// bytes -> UTF-8 text: a byte that does not start a well-formed character
// becomes U+FFFD, as transformers' decode does (a BPE's sample may draw a
// lone byte of a character, or stop inside one).
std::string replace_invalid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 1;
    try {
      data::decode_utf8(s.substr(i, len), "sample");  // throws unless s[i, i + len) is one well-formed character
      out += s.substr(i, len);
      i += len;
    } catch (const Error&) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += 1;
    }
  }
  return out;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(const std::u32string& text) const {
  return bpe ? bpe->encode(data::encode_utf8(text)) : chars.encode(text);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  return bpe ? replace_invalid_utf8(bpe->decode(ids)) : chars.decode(ids);
}

std::vector<int32_t> Tokenizer::prompt() const {
  if (bpe) {
    std::vector<int32_t> newline = bpe->encode("\n");
    return newline.size() == 1 ? newline : std::vector<int32_t>{0};
  }
  return chars.vocab_utf8().find('\n') != std::string::npos ? chars.encode(U"\n") : std::vector<int32_t>{0};
}

std::string Tokenizer::record() const { return bpe ? kBpeRecord + bpe->fingerprint() : chars.vocab_utf8(); }

Tokenizer make_tokenizer(const Args& a, const std::u32string& text, const std::string& resumed_vocab) {
  Tokenizer t;
  const bool resumed_bpe = resumed_vocab.rfind(kBpeRecord, 0) == 0;
  if (a.tokenizer.empty()) {
    LOOM_CHECK(!resumed_bpe, "--resume ", a.resume, " was trained on the ids of a BPE tokenizer (", resumed_vocab,
               "), not on characters; pass that --tokenizer FILE");
    t.chars = resumed_vocab.empty() ? data::CharTokenizer::from_text(text)
                                    : data::CharTokenizer::from_vocab_utf8(resumed_vocab);
    return t;
  }
  try {
    t.bpe = std::make_shared<const data::BpeTokenizer>(data::BpeTokenizer::from_file(a.tokenizer));
  } catch (const Error& e) {  // --init-from's own tokenizer.json: say where it came from, and the way out
    if (!a.tokenizer_from_init) throw;
    throw Error(str("--init-from ", a.init_from, " has a tokenizer.json that loom cannot read, so it cannot train on "
                    "the ids the model knows (", e.what(), "); pass a byte-level BPE --tokenizer FILE"));
  }
  LOOM_CHECK(resumed_vocab.empty() || resumed_vocab == t.record(), "--tokenizer ", a.tokenizer, " (", t.record(),
             ") is not the tokenizer --resume ", a.resume, " was trained with (",
             resumed_bpe ? resumed_vocab : "characters, no --tokenizer", ")");
  return t;
}

}  // namespace loom::train
