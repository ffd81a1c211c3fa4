// train_gpt's tokenizer: the corpus's characters (data::CharTokenizer, the
// default), or with --tokenizer FILE a byte-level BPE read from a Hugging Face
// tokenizer.json (data/bpe_tokenizer.h), so that a run trains on the ids a
// reference model (--init-from) was trained on. A checkpoint records which.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/data.h"
#include "train/args.h"

namespace loom::train {

struct Tokenizer {
  data::CharTokenizer chars;                      // without --tokenizer
  std::shared_ptr<const data::BpeTokenizer> bpe;  // --tokenizer FILE

  int64_t vocab_size() const { return bpe ? bpe->vocab_size() : chars.vocab_size(); }
  std::vector<int32_t> encode(const std::u32string& text) const;
  // UTF-8 text; a BPE's bytes that are no character become U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The sample's prompt: a newline when the vocabulary encodes one, else token 0.
  std::vector<int32_t> prompt() const;
  const char* unit() const { return bpe ? "tokens" : "characters"; }
  // What a checkpoint's "vocab" holds: the characters in id order, or
  // "tokenizer.json <FNV-1a of the file>" for a BPE (which no character
  // vocabulary can be: its code points are sorted and distinct).
  std::string record() const;
};

// --tokenizer, or the characters of text (or of the checkpoint --resume
// recorded, resumed_vocab). A resume whose checkpoint recorded another
// tokenizer - another tokenizer.json, a BPE where it had characters, or the
// reverse - is refused, naming both.
Tokenizer make_tokenizer(const Args& a, const std::u32string& text, const std::string& resumed_vocab);

}  // namespace loom::train
