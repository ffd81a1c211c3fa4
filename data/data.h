// The text data of train_gpt: a character-level tokenizer built from the
// corpus, a train/val split, and random windows drawn from a seeded generator.
//
// A "global batch" is drawn the same way on every process; a data-parallel rank
// then takes its own slice of it, so a run's numbers don't depend on how the
// batch is split across ranks or micro-batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/generator.h"

namespace loom::data {

// Characters are Unicode code points; the vocabulary is the sorted set of
// code points in the corpus, so token ids are stable for a given text.
class CharTokenizer {
 public:
  CharTokenizer() = default;
  static CharTokenizer from_text(const std::u32string& text);
  static CharTokenizer from_vocab_utf8(const std::string& vocab);  // as saved in a checkpoint

  int64_t vocab_size() const { return int64_t(chars_.size()); }
  std::vector<int32_t> encode(const std::u32string& text) const;  // error on an unknown character
  std::string decode(const std::vector<int32_t>& ids) const;      // UTF-8
  std::string vocab_utf8() const;                                  // every character, in id order

 private:
  std::u32string chars_;
};

// UTF-8 <-> code points. decode_utf8 errors name `where` and the byte offset.
std::u32string decode_utf8(const std::string& bytes, const std::string& where);
std::string encode_utf8(const std::u32string& text);

// The default corpus: the plain-text files of Debian's `fortunes` package
// (/usr/share/games/fortunes, no .dat indexes, no .u8 links), in name order.
std::string default_corpus_path();
// What read_corpus read and what it dropped, for the run's "data:" line.
struct CorpusStats {
  int64_t characters = 0;  // decoded, before dropping
  int64_t dropped = 0;     // control characters dropped
  int64_t nul = 0;         // of which NUL bytes
};

// Reads a UTF-8 text file, or every regular file of a directory (the
// fortunes), in name order. A FIFO or a device is refused (it would block, or
// never end). Control characters other than newline and tab are dropped
// (fortunes use backspace "overstriking"), counted in stats; a file with
// nothing else (all NUL bytes) is refused saying so.
std::u32string read_corpus(const std::string& path, CorpusStats* stats = nullptr);

// "; 12 control characters dropped (3 NUL bytes)", "" when none.
std::string dropped_note(const CorpusStats& stats);

struct Batch {
  Tensor x;  // [B, T] int64 token ids
  Tensor y;  // [B, T] int64, x shifted by one
};

class TextDataset {
 public:
  // Splits ids into train (first 90%) and val (last 10%). The corpus must be
  // longer than block_size (an error naming the sizes otherwise); when the
  // last 10% is not, val is the training text (val_is_train()).
  TextDataset(std::vector<int32_t> ids, int64_t block_size, double train_fraction = 0.9);

  // B random windows of block_size + 1 tokens from one split ("train"/"val").
  Batch sample(const std::string& split, int64_t batch, Generator& gen) const;
  // Rows [begin, begin + count) of a batch: a data-parallel rank's or a
  // micro-batch's slice of the global batch.
  static Batch slice(const Batch& b, int64_t begin, int64_t count);
  // Megatron's --eod-mask-loss: each target that follows an end-of-document
  // token (x[b, t] == eod) becomes ignore_index, so the model is not taught to
  // guess the first token of an unrelated next document from the last one.
  static Batch mask_loss_after(const Batch& b, int64_t eod, int64_t ignore_index = -100);

  int64_t block_size() const { return block_; }
  int64_t train_tokens() const { return int64_t(train_.size()); }
  int64_t val_tokens() const { return int64_t(val_.size()); }
  // A corpus too short for a held-out tenth validates on the training text:
  // " (validation = the training text: the corpus is too short to hold out a tenth)", or "".
  bool val_is_train() const { return val_is_train_; }
  std::string val_note() const;

 private:
  std::vector<int32_t> train_, val_;
  int64_t block_;
  bool val_is_train_ = false;
};

}  // namespace loom::data
