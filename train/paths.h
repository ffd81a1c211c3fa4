// train_gpt's files, checked against each other before any work: a run must
// never destroy what it reads or what another of its outputs writes.
//   inputs   --data (a regular file, or a directory of them), --resume (PATH
//            and its manifest)
//   outputs  --save (PATH, its manifest, their ".tmp", and the pieces
//            "<stem>.step<N>.*" that a commit writes and later removes),
//            --log, --trace, --memory-json, --schedule-svg
// Paths are compared as files (canonical paths, and hard links by identity):
// `--log x.txt --data x.txt` is refused, not a corpus overwritten; an output
// inside a --data directory is refused (it would be read as text next time).
// --save may name --resume's checkpoint: the commit keeps the old one whole
// until the new one is complete (optim/checkpoint_manifest.h).
#pragma once

#include "train/args.h"

namespace loom::train {

// Throws naming both flags and paths, or the flag and what the path is.
void check_paths(const Args& a);

}  // namespace loom::train
