#include "optim/checkpoint_manifest.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "parallel/comm/handshake.h"
#include "tensor/error.h"
#include "tensor/numbers.h"

namespace fs = std::filesystem;

namespace loom::optim {

namespace {

std::string strip_ext(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.ends_with(ext) && path.size() > ext.size() ? path.substr(0, path.size() - ext.size()) : path;
}

// A number as loom writes it (std::to_string): digits, no leading zero. "01" is a
// user's name, never one of loom's pieces, so the clean-up leaves it alone.
bool digits(const std::string& s, size_t max_len) {
  return !s.empty() && s.size() <= max_len && s.find_first_not_of("0123456789") == std::string::npos &&
         (s.size() == 1 || s[0] != '0');
}

}  // namespace

std::string piece_path(const std::string& path, int64_t step, const std::string& what) {
  return strip_ext(path) + ".step" + std::to_string(step) + "." + what + ".safetensors";
}

CheckpointPiece describe_piece(const std::string& file_path) {
  std::ifstream in(file_path, std::ios::binary);
  LOOM_CHECK(in, "checkpoint: cannot read '", file_path, "'");
  parallel::Fingerprint f;
  int64_t bytes = 0;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const std::streamsize n = in.gcount();
    f.add(buf.data(), size_t(n));
    bytes += n;
  }
  return {fs::path(file_path).filename().string(), bytes, f.hex()};
}

std::string encode_pieces(const std::vector<CheckpointPiece>& pieces) {
  std::string s;
  for (const CheckpointPiece& p : pieces) s += (s.empty() ? "" : ";") + p.file + ":" + std::to_string(p.bytes) + ":" + p.checksum;
  return s;
}

std::vector<CheckpointPiece> decode_pieces(const std::string& s, const std::string& manifest_path) {
  std::vector<CheckpointPiece> out;
  std::stringstream list(s);
  for (std::string rec; std::getline(list, rec, ';');) {
    size_t a = rec.find(':'), b = rec.rfind(':');
    LOOM_CHECK(a != std::string::npos && b > a, "checkpoint manifest '", manifest_path, "': malformed piece '", rec,
               "' (expected file:bytes:checksum)");
    out.push_back({rec.substr(0, a), parse_int(rec.substr(a + 1, b - a - 1), manifest_path, "pieces"),
                   rec.substr(b + 1)});
  }
  return out;
}

void verify_pieces(const std::vector<CheckpointPiece>& pieces, const std::string& manifest_path) {
  const fs::path dir = fs::path(manifest_path).parent_path();
  for (const CheckpointPiece& want : pieces) {
    const std::string file = (dir / want.file).string();
    LOOM_CHECK(fs::exists(file), "checkpoint: piece '", file, "' listed in the manifest '", manifest_path,
               "' is missing");
    CheckpointPiece got = describe_piece(file);
    LOOM_CHECK(got.bytes == want.bytes && got.checksum == want.checksum, "checkpoint: piece '", file, "' is ",
               got.bytes, " bytes with checksum ", got.checksum, " but the manifest '", manifest_path, "' says ",
               want.bytes, " bytes with checksum ", want.checksum,
               ": it was changed or overwritten after the checkpoint was committed");
  }
}

bool is_piece_name(const std::string& name, const std::string& base, int64_t* step, bool* temporary) {
  const std::string prefix = base + ".step";
  if (!name.starts_with(prefix)) return false;
  std::string rest = name.substr(prefix.size());  // "12.optim.0.safetensors[.tmp]"
  const bool tmp = rest.ends_with(".tmp");
  if (tmp) rest.resize(rest.size() - 4);
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || !digits(rest.substr(0, dot), 18)) return false;
  const std::string what = rest.substr(dot + 1);  // "model.safetensors" or "optim.<rank>.safetensors"
  const std::string ext = ".safetensors";
  const bool model = what == "model" + ext;
  const bool shard = what.starts_with("optim.") && what.ends_with(ext) && what.size() > 6 + ext.size() &&
                     digits(what.substr(6, what.size() - 6 - ext.size()), 9);
  if (!model && !shard) return false;
  if (step) *step = std::stoll(rest.substr(0, dot));
  if (temporary) *temporary = tmp;
  return true;
}

void remove_stale_pieces(const std::string& path, int64_t step) {
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  const std::string base = fs::path(strip_ext(path)).filename().string();
  const std::string model_name = fs::path(path).filename().string();
  const std::string manifest_name = base + ".optim.safetensors";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t s = -1;
    bool tmp = false;
    // Only loom's own names: "notes.txt" or "gpt.step3.txt" beside the checkpoint are the user's.
    const bool piece = is_piece_name(name, base, &s, &tmp);
    // Once `step` is committed every rank has finished its pieces of it, so a
    // temporary of this step or before is a leftover; one of a later step may
    // be a rank already writing the next checkpoint. PATH.tmp and the
    // manifest's temporary are rank 0's, which is here.
    const bool old_piece = piece && !tmp && s < step;
    const bool leftover = (piece && tmp && s <= step) || name == model_name + ".tmp" || name == manifest_name + ".tmp";
    if (old_piece || leftover) fs::remove(e.path(), ec);  // best effort: a file another process removed is fine
  }
}

void check_checkpoint_name(const std::string& path, int64_t max_step, int ranks) {
  const fs::path p(path);
  const std::string base = fs::path(strip_ext(path)).filename().string();
  const size_t sep = base.find_first_of(";:,");
  LOOM_CHECK(sep == std::string::npos, "checkpoint '", path, "': the name holds '",
             sep == std::string::npos ? ' ' : base[sep],
             "', which the manifest uses to separate its pieces (';', ':' and ','); choose a name without them");
  // The longest name a save writes: the last rank's shard at the last step, as a temporary.
  const std::string last_shard = piece_path(path, max_step, "optim." + std::to_string(ranks - 1));
  const std::string longest = fs::path(last_shard).filename().string() + ".tmp";
  fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  while (!fs::exists(dir) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
  const long limit = pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t name_max = limit > 0 ? size_t(limit) : 255;
  LOOM_CHECK(longest.size() <= name_max, "checkpoint '", path, "': its pieces' names would be too long for the file "
             "system (", longest.size(), " characters for '", longest, "', the limit is ", name_max,
             "); choose a shorter name");
}

// loom's one number parser (tensor/numbers.h): the whole string is the number.
int64_t parse_int(const std::string& value, const std::string& file, const std::string& key) {
  std::optional<int64_t> v = read_int64(value);
  LOOM_CHECK(v, "checkpoint '", file, "': '", key, "' = '", value, "' is not an integer");
  return *v;
}

double parse_double(const std::string& value, const std::string& file, const std::string& key) {
  std::optional<double> v = read_double(value);
  LOOM_CHECK(v, "checkpoint '", file, "': '", key, "' = '", value, "' is not a number");
  return *v;
}

}  // namespace loom::optim
