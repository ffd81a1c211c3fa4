#include "optim/checkpoint_manifest_check.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>
#include <vector>

#include "optim/checkpoint_manifest.h"
#include "parallel/comm/handshake.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

// Each field with its length first, so that no two contents hash the same text.
void add_field(parallel::Fingerprint& f, const std::string& s) {
  const uint64_t n = s.size();
  f.add(&n, sizeof n);
  f.add(s.data(), s.size());
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream list(s);
  for (std::string item; std::getline(list, item, sep);) out.push_back(item);
  return out;
}

// A name within the checkpoint's directory: no directory part, not "." or "..".
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

std::string manifest_checksum(const nn::NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  parallel::Fingerprint f;
  for (const auto& [key, value] : metadata) {  // a std::map: by key
    if (key == "checksum") continue;
    add_field(f, key);
    add_field(f, value);
  }
  // By name: the file holds them in its JSON header's order, which need not be the order they were saved in.
  std::vector<const std::pair<std::string, Tensor>*> sorted;
  for (const auto& entry : tensors) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
  for (const auto* entry : sorted) {
    const Tensor t = ops::contiguous(entry->second);
    add_field(f, entry->first);
    add_field(f, dtype_name(t.dtype()));
    add_field(f, shape_str(t.shape()));
    f.add(t.raw_data(), t.nbytes());
  }
  return f.hex();
}

void write_manifest(const std::string& index_path, const nn::NamedTensors& tensors,
                    std::map<std::string, std::string> metadata) {
  metadata["checksum"] = manifest_checksum(tensors, metadata);
  nn::save_safetensors(index_path, tensors, metadata);
}

nn::SafetensorsFile read_manifest(const std::string& index_path) {
  nn::SafetensorsFile m = nn::load_safetensors(index_path);
  auto meta = [&](const char* key) -> const std::string& {
    auto it = m.metadata.find(key);
    LOOM_CHECK(it != m.metadata.end(), "checkpoint manifest '", index_path, "': metadata has no '", key, "'");
    return it->second;
  };
  // 1. The content is what was committed.
  const std::string stored = meta("checksum"), computed = manifest_checksum(m.tensors, m.metadata);
  LOOM_CHECK(stored == computed, "checkpoint manifest '", index_path, "': its content has checksum ", computed,
             " but it says ", stored, ": it was edited or damaged after the checkpoint was committed");

  // 2. Every field against the others. The step: the metadata's and train.step.
  const int64_t step = parse_int(meta("step"), index_path, "step");
  LOOM_CHECK(m.contains("train.step") && m.at("train.step").numel() == 1, "checkpoint manifest '", index_path,
             "': no train.step of one element");
  const int64_t train_step = m.at("train.step").to_vector<int64_t>()[0];
  LOOM_CHECK(step >= 0 && train_step == step, "checkpoint manifest '", index_path, "': the metadata says step ", step,
             " but train.step is ", train_step);
  LOOM_CHECK(m.contains("train.data_rng") && m.at("train.data_rng").numel() == 4, "checkpoint manifest '", index_path,
             "': no train.data_rng of 4 words (the data generator's state)");
  // The pieces: plain names, each once, exactly the model and the shards.
  const std::vector<CheckpointPiece> pieces = decode_pieces(meta("pieces"), index_path);
  std::set<std::string> listed;
  for (const CheckpointPiece& p : pieces) {
    LOOM_CHECK(plain_file_name(p.file), "checkpoint manifest '", index_path, "': piece '", p.file,
               "' is not a plain file name; a checkpoint's pieces lie beside its manifest");
    LOOM_CHECK(listed.insert(p.file).second, "checkpoint manifest '", index_path, "': piece '", p.file,
               "' is listed twice");
  }
  std::set<std::string> expected{meta("model")};
  for (const std::string& shard : split(meta("shards"), ',')) expected.insert(shard);
  for (const std::string& file : expected)
    LOOM_CHECK(listed.count(file), "checkpoint manifest '", index_path, "': '", file, "' is named as ",
               file == meta("model") ? "the model" : "a shard", " but not listed in 'pieces' (so never verified)");
  for (const std::string& file : listed)
    LOOM_CHECK(expected.count(file), "checkpoint manifest '", index_path, "': piece '", file,
               "' is neither the model nor a shard");

  // 3. Every piece on disk as listed.
  verify_pieces(pieces, index_path);
  return m;
}

}  // namespace loom::optim
