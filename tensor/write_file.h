// The one way loom replaces a text file it writes (--trace, --memory-json,
// --schedule-svg): the whole text to PATH.tmp, then a rename over PATH, so a
// reader never sees half a file and a failed write leaves the old one intact.
// (Checkpoints go further: optim/checkpoint_manifest.h commits a set of files.)
#pragma once

#include <string>

namespace loom {

// Throws loom::Error naming `what` and the path when the file cannot be written.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace loom
