#include "optim/checkpoint_manifest.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "parallel/comm/handshake.h"
#include "tensor/error.h"

namespace fs = std::filesystem;

namespace loom::optim {

namespace {

std::string strip_ext(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.ends_with(ext) && path.size() > ext.size() ? path.substr(0, path.size() - ext.size()) : path;
}

// The step in a piece's name "<base>.step<N>.<what>.safetensors", or -1.
int64_t step_of(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".step";
  if (!name.starts_with(prefix)) return -1;
  size_t end = name.find('.', prefix.size());
  std::string digits = name.substr(prefix.size(), end == std::string::npos ? std::string::npos : end - prefix.size());
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
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

void remove_stale_pieces(const std::string& path, int64_t step) {
  const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  const std::string base = fs::path(strip_ext(path)).filename().string();
  const std::string model_name = fs::path(path).filename().string();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t s = step_of(name, base);
    // Once `step` is committed every rank has finished its pieces of it, so a
    // temporary of this step or before is a leftover; one of a later step may
    // be a rank already writing the next checkpoint.
    const bool old_piece = s >= 0 && s < step && !name.ends_with(".tmp");
    const bool leftover = name.ends_with(".tmp") && (name.starts_with(base + ".") || name == model_name + ".tmp") &&
                          s <= step;
    if (old_piece || leftover) fs::remove(e.path(), ec);  // best effort: a file another process removed is fine
  }
}

// The whole string must be the number: std::stoll("6x") would read 6.
template <class T, class Parse>
static T parse_strictly(const std::string& value, const std::string& file, const std::string& key, const char* what,
                        Parse parse) {
  size_t used = 0;
  T v{};
  try {
    v = parse(value, &used);
  } catch (...) {
    used = 0;
  }
  LOOM_CHECK(!value.empty() && used == value.size() && !std::isspace(static_cast<unsigned char>(value[0])),
             "checkpoint '", file, "': '", key, "' = '", value, "' is not ", what);
  return v;
}

int64_t parse_int(const std::string& value, const std::string& file, const std::string& key) {
  return parse_strictly<int64_t>(value, file, key, "an integer",
                                 [](const std::string& s, size_t* used) { return std::stoll(s, used); });
}

double parse_double(const std::string& value, const std::string& file, const std::string& key) {
  return parse_strictly<double>(value, file, key, "a number",
                                [](const std::string& s, size_t* used) { return std::stod(s, used); });
}

}  // namespace loom::optim
