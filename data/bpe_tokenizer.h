// GPT-2's tokenizer: byte-level BPE read from a Hugging Face `tokenizer.json`
// (the `tokenizers` package's file: model.type "BPE", pre_tokenizer
// "ByteLevel"), so loom encodes text to the ids a reference model was
// trained on. Three steps, as tokenizers and GPT-2's encoder.py do them:
//   1. split the text into words with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      ("Hello  world's" -> "Hello", " ", " world", "'s")
//   2. write each word's UTF-8 bytes as printable characters (bytes_to_unicode:
//      ' ' -> 'Ġ', '\n' -> 'Ċ'), so every byte is a symbol of the vocabulary
//   3. merge adjacent symbols, lowest merge rank first, until no pair is a merge
// Decoding joins the tokens and maps the characters back to bytes.
// Non-ASCII code points are classified for step 1 by a short table
// (letters, a few digit and punctuation ranges), not Unicode's full one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::data {

class BpeTokenizer {
 public:
  // Errors name the file and what is missing or not supported.
  static BpeTokenizer from_file(const std::string& tokenizer_json);

  int64_t vocab_size() const { return int64_t(tokens_.size()); }
  std::vector<int32_t> encode(const std::string& utf8) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // the bytes, as UTF-8 text

  // The file's FNV-1a hash (16 hex digits): what a checkpoint records of the
  // tokenizer, so that a resume with another tokenizer.json is refused.
  const std::string& fingerprint() const { return fingerprint_; }

  // Step 1 alone (the words, as UTF-8), for tests.
  static std::vector<std::string> pre_tokenize(const std::string& utf8);

 private:
  std::unordered_map<std::string, int32_t> ids_;   // token (byte-level characters, UTF-8) -> id
  std::vector<std::string> tokens_;                // id -> token
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
  bool add_prefix_space_ = false;
  std::string fingerprint_;
};

}  // namespace loom::data
