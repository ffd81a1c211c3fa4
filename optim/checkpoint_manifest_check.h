// What a resume trusts in a checkpoint's manifest (PATH.optim.safetensors,
// checkpoint_manifest.h), checked before any of it is used. The pieces carry
// checksums in the manifest; this file checks the manifest itself:
//   1. its own checksum: FNV-1a 64 over its metadata (but "checksum") and its
//      tensors (train.step, train.data_rng, ...), stored as metadata
//      "checksum". An edited step or data-generator state is refused, not
//      resumed at another step or with another data order.
//   2. every field against the others: the step in the metadata and in
//      train.step; "model" and every file of "shards" listed in "pieces", and
//      nothing else there, each once; the generator state of 4 words.
//   3. every piece a plain file name beside the manifest ("../x" or "a/b"
//      would read files outside the checkpoint), of the listed size and checksum.
#pragma once

#include <map>
#include <string>

#include "nn/module.h"
#include "nn/safetensors.h"

namespace loom::optim {

// The checksum of a manifest's content: its metadata but "checksum", by key,
// and its tensors by name (dtype, shape and bytes), 16 hex digits.
std::string manifest_checksum(const nn::NamedTensors& tensors, const std::map<std::string, std::string>& metadata);

// Writes the manifest (atomically: safetensors' temp file + rename, the commit)
// with its checksum added to the metadata.
void write_manifest(const std::string& index_path, const nn::NamedTensors& tensors,
                    std::map<std::string, std::string> metadata);

// Reads the manifest and checks 1-3 above; an error names the manifest and
// what disagrees.
nn::SafetensorsFile read_manifest(const std::string& index_path);

}  // namespace loom::optim
