// Committing a checkpoint as a set. A checkpoint is several files written by
// several ranks (the model, one optimizer shard per rank, the index); a crash
// between two of them must never leave a mix of two steps that resumes
// silently. So every piece is written under a name of its own step
// (gpt.step12.optim.0.safetensors), the previous step's pieces stay on disk,
// and the manifest - the index, PATH.optim.safetensors - is written last, once
// every rank has finished its pieces, atomically (temp file + rename). It names
// every piece with its size and checksum: that rename is the commit. A resume
// reads the manifest, checks it (its own checksum, its fields against each
// other: checkpoint_manifest_check.h) and verifies every piece before it
// trusts any; after a commit the older steps' pieces and the temporaries of
// interrupted saves are removed, by loom's own names only. (Megatron's
// latest_checkpointed_iteration.txt plays the same role.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::optim {

struct CheckpointPiece {
  std::string file;      // the name within the checkpoint's directory
  int64_t bytes = 0;
  std::string checksum;  // FNV-1a 64 of the file's bytes, 16 hex digits
};

// path "out/gpt.safetensors", step 12, what "optim.0" -> "out/gpt.step12.optim.0.safetensors".
std::string piece_path(const std::string& path, int64_t step, const std::string& what);

// The size and checksum of a file on disk (file: its name without the directory).
CheckpointPiece describe_piece(const std::string& file_path);

// "file:bytes:checksum" records separated by ';' (the manifest's metadata).
std::string encode_pieces(const std::vector<CheckpointPiece>& pieces);
std::vector<CheckpointPiece> decode_pieces(const std::string& s, const std::string& manifest_path);

// Every piece exists beside the manifest with its size and checksum; an error
// names the piece, what differs and the manifest.
void verify_pieces(const std::vector<CheckpointPiece>& pieces, const std::string& manifest_path);

// Is `name` a piece of the checkpoint whose file name without ".safetensors"
// is `base`: "<base>.step<N>.model.safetensors" or
// "<base>.step<N>.optim.<rank>.safetensors", or one of their ".tmp" files?
// step and temporary (when given) say which.
bool is_piece_name(const std::string& name, const std::string& base, int64_t* step = nullptr,
                   bool* temporary = nullptr);

// After the commit of `step`: removes this checkpoint's pieces of earlier steps
// and the temporaries an interrupted save left (pieces' ".tmp", PATH.tmp, the
// manifest's). Only those names (is_piece_name): other files that share the
// stem are never touched. Never a piece of `step` or a temporary of a later
// step (a rank may already be writing the next checkpoint).
void remove_stale_pieces(const std::string& path, int64_t step);

// A checkpoint name that round-trips, checked before training: its stem holds
// none of the manifest's separators (';' ':' ','), and its longest piece name
// (at step max_step, written by rank ranks - 1, with ".tmp") fits the file
// system's name limit. Error naming the path and the reason.
void check_checkpoint_name(const std::string& path, int64_t max_step, int ranks);

// A strict integer / float from a metadata string: "6x", "" or " 6" are errors
// naming the file and key.
int64_t parse_int(const std::string& value, const std::string& file, const std::string& key);
double parse_double(const std::string& value, const std::string& file, const std::string& key);

}  // namespace loom::optim
