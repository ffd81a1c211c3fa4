// train_gpt's corpus: the text, its tokenizer (characters, or --tokenizer's
// BPE), the train/val split and the model config. Every rank reads the corpus
// and later draws the same global batches; the corpus's size and hash are
// compared over world first. With --resume the checkpoint's config and
// vocabulary win over the flags; with --init-from the folder's config does.
#pragma once

#include <cstdint>

#include "data/data.h"
#include "nn/gpt.h"
#include "parallel/comm/process_group.h"
#include "train/args.h"
#include "train/tokenizer.h"

namespace loom::train {

struct Corpus {
  Tokenizer tok;
  data::TextDataset ds;
  nn::GPTConfig cfg;
  int64_t eod = -1;  // --eod-mask-loss's token id (-1: off)
};

// Collective over world (the data handshake); prints the data line on rank 0.
Corpus load_corpus(const Args& a, parallel::ProcessGroup& world);

}  // namespace loom::train
