#include "optim/checkpoint.h"

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <map>
#include <sstream>
#include <unordered_map>

#include "nn/arch_metadata.h"
#include "nn/safetensors.h"
#include "optim/checkpoint_manifest.h"
#include "optim/checkpoint_manifest_check.h"
#include "optim/checkpoint_tensor_parallel.h"
#include "parallel/comm/handshake.h"
#include "parallel/comm/watchdog.h"
#include "tensor/numbers.h"
#include "tensor/ops.h"

namespace loom::optim {

namespace {

std::string strip_ext(const std::string& path) {
  const std::string ext = ".safetensors";
  std::string base = path;
  if (base.size() > ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0)
    base.resize(base.size() - ext.size());
  return base;
}

// main param -> its model param's name
std::string name_of(const MainParam& m, const std::unordered_map<const TensorImpl*, std::string>& names) {
  auto it = names.find(m.model_param.impl());
  LOOM_CHECK(it != names.end(), "checkpoint: the optimizer holds a param ", m.model_param.describe(),
             " that is not among the model's named parameters");
  return it->second;
}

std::unordered_map<const TensorImpl*, std::string> names_by_tensor(const nn::NamedTensors& params) {
  std::unordered_map<const TensorImpl*, std::string> names;
  for (const auto& [name, p] : params) names.emplace(p.impl(), name);
  return names;
}

const char* kKinds[] = {"main", "exp_avg", "exp_avg_sq"};

// This rank's optimizer state as saved: per main param, "<kind>/<param name>/<first element>".
nn::NamedTensors optimizer_fragments(const MixedPrecisionOptimizer& opt, const nn::NamedTensors& params) {
  auto names = names_by_tensor(params);
  nn::NamedTensors shard;
  for (size_t i = 0; i < opt.main_params().size(); ++i) {
    const MainParam& m = opt.main_params()[i];
    const AdamWState& st = opt.adam_state(i);
    const std::string key = str("/", name_of(m, names), "/", m.start);
    // On a GPU (--device cuda) the shard is written from host copies; on the CPU ops::to is the tensor itself.
    shard.push_back({str("main", key), ops::to(m.main, kCPU)});
    shard.push_back({str("exp_avg", key), ops::to(st.exp_avg, kCPU)});
    shard.push_back({str("exp_avg_sq", key), ops::to(st.exp_avg_sq, kCPU)});
    shard.push_back({str("step", key), st.step});
  }
  return shard;
}

}  // namespace

std::string optimizer_path(const std::string& model_path) { return strip_ext(model_path) + ".optim.safetensors"; }

void save_checkpoint(const std::string& path, const nn::NamedTensors& model_state, const nn::GPTConfig& cfg,
                     const std::string& vocab_utf8, const MixedPrecisionOptimizer& opt,
                     const nn::NamedTensors& params, const TrainState& state, parallel::ProcessGroup& world,
                     bool write_shard, const nn::NamedTensors* fragments) {
  LOOM_CHECK(!path.empty() && !path.ends_with("/") && !std::filesystem::is_directory(path), "checkpoint: '", path,
             "' names a directory; give a file path such as ", path, path.ends_with("/") ? "" : "/",
             "gpt.safetensors");
  const int64_t step = state.step;
  const std::string step_str = std::to_string(step);
  optim::check_checkpoint_name(path, step, world.size());  // train_gpt checks it before training too
  // A file-size limit (ulimit -f) would kill the process with SIGXFSZ halfway
  // through a write; ignored, the write fails with EFBIG instead and the save
  // reports it, the previous checkpoint left whole.
  std::signal(SIGXFSZ, SIG_IGN);
  // 1. This rank's optimizer shard, under a name of its own step: the previous
  //    checkpoint stays whole on disk until the new manifest replaces it.
  std::string mine;
  if (write_shard) {
    // A busy disk may hold its fsync longer than a collective's timeout: the others wait on (watchdog.h).
    parallel::watchdog::LocalWork writing(str("writing checkpoint ", path, " (optimizer shard)"));
    const std::string file = optim::piece_path(path, step, "optim." + std::to_string(world.rank()));
    nn::save_safetensors(file, fragments ? *fragments : optimizer_fragments(opt, params),
                         {{"format", "loom-optimizer-shard"}, {"step", step_str}});
    mine = optim::encode_pieces({optim::describe_piece(file)});
  }
  // 2. Every rank's piece, gathered on rank 0 (also the barrier: the manifest
  //    never lists a piece that is not complete on disk).
  std::vector<std::string> gathered = parallel::all_gather_strings(world, mine);
  if (world.rank() != 0) return;
  // The other ranks go on to their next collective (--export-hf's gather) and wait there for this rank.
  parallel::watchdog::LocalWork writing(str("writing checkpoint ", path));

  // 3. The model piece: every parameter of the whole GPT, config and vocabulary in its metadata.
  std::map<std::string, std::string> meta = {
      {"format", "loom-gpt"}, {"vocab", vocab_utf8}, {"step", step_str},
      {"vocab_size", std::to_string(cfg.vocab_size)}, {"block_size", std::to_string(cfg.block_size)},
      {"n_layer", std::to_string(cfg.n_layer)}, {"n_head", std::to_string(cfg.n_head)},
      {"n_embd", std::to_string(cfg.n_embd)}, {"dropout", std::to_string(cfg.dropout)},
      {"seed", std::to_string(cfg.seed)}};
  for (const auto& [key, value] : nn::arch_metadata(cfg)) meta[key] = value;  // nothing for GPT-2
  const std::string model_piece = optim::piece_path(path, step, "model");
  nn::save_safetensors(model_piece, model_state, meta);

  // 4. The manifest, written last: its rename commits the set.
  std::vector<optim::CheckpointPiece> pieces{optim::describe_piece(model_piece)};
  std::string shards;
  for (const std::string& g : gathered) {
    if (g.empty()) continue;  // a replica's rank wrote nothing
    for (const optim::CheckpointPiece& p : optim::decode_pieces(g, path)) {
      pieces.push_back(p);
      shards += (shards.empty() ? "" : ",") + p.file;
    }
  }
  nn::NamedTensors index;
  std::vector<int64_t> rng(state.data_rng.begin(), state.data_rng.end());
  index.push_back({"train.data_rng", from_vector(rng)});
  index.push_back({"train.step", from_vector(std::vector<int64_t>{step})});
  index.push_back({"train.dropout_offset", from_vector(std::vector<int64_t>{int64_t(state.dropout_offset)})});
  if (opt.scaler())
    for (auto& [name, t] : opt.scaler()->state_dict()) index.push_back({"scaler." + name, t});
  optim::write_manifest(optimizer_path(path), index,
                        {{"format", "loom-optimizer-index"}, {"step", step_str}, {"shards", shards},
                         {"model", pieces[0].file}, {"pieces", optim::encode_pieces(pieces)}});

  // 5. PATH itself: the model piece under the name the user gave (a hard link,
  //    no second copy, renamed into place), for PyTorch and for eyes.
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  std::filesystem::create_hard_link(model_piece, tmp, ec);
  if (ec) std::filesystem::copy_file(model_piece, tmp, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(tmp, path);

  // 6. The previous steps' pieces and any leftovers of an interrupted save.
  optim::remove_stale_pieces(path, step);
}

namespace {

// The committed manifest of the checkpoint at `path`, itself and every piece
// verified (checkpoint_manifest_check.h).
nn::SafetensorsFile committed_manifest(const std::string& path) {
  const std::string index_path = optimizer_path(path);
  LOOM_CHECK(std::filesystem::exists(index_path), "checkpoint '", path, "': no manifest '", index_path,
             "' (the checkpoint was never committed, or this is a model file without optimizer state)");
  return optim::read_manifest(index_path);
}

int64_t meta_int(const nn::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  LOOM_CHECK(it != f.metadata.end(), "checkpoint '", f.path, "': metadata has no '", key, "'");
  return optim::parse_int(it->second, f.path, key);
}

std::string model_piece_of(const nn::SafetensorsFile& index) {
  return (std::filesystem::path(index.path).parent_path() / index.metadata.at("model")).string();
}

// Every piece carries the step of the manifest that lists it.
void check_step(const nn::SafetensorsFile& piece, const nn::SafetensorsFile& index) {
  auto it = piece.metadata.find("step");
  LOOM_CHECK(it != piece.metadata.end() && it->second == index.metadata.at("step"), "checkpoint: piece '",
             piece.path, "' is of step ", it == piece.metadata.end() ? "(none)" : it->second, " but the manifest '",
             index.path, "' is of step ", index.metadata.at("step"));
}

}  // namespace

nn::SafetensorsFile load_model_piece(const std::string& path) {
  nn::SafetensorsFile index = committed_manifest(path);
  nn::SafetensorsFile f = nn::load_safetensors(model_piece_of(index));
  check_step(f, index);
  return f;
}

nn::GPTConfig load_config(const std::string& path, std::string* vocab_utf8) {
  nn::SafetensorsFile f = load_model_piece(path);
  nn::GPTConfig c;
  c.vocab_size = meta_int(f, "vocab_size");
  c.block_size = meta_int(f, "block_size");
  c.n_layer = meta_int(f, "n_layer");
  c.n_head = meta_int(f, "n_head");
  c.n_embd = meta_int(f, "n_embd");
  // A seed is any uint64 (--seed 18446744073709551615), past int64's end: read as one.
  const std::optional<uint64_t> seed = read_uint64(f.metadata.count("seed") ? f.metadata.at("seed") : "");
  LOOM_CHECK(seed, "checkpoint '", f.path, "': 'seed' is missing or not an unsigned integer");
  c.seed = *seed;
  nn::read_arch_metadata(c, f.metadata);  // Llama's options; GPT-2's defaults when absent
  auto d = f.metadata.find("dropout");
  if (d != f.metadata.end()) c.dropout = optim::parse_double(d->second, f.path, "dropout");
  auto v = f.metadata.find("vocab");
  LOOM_CHECK(v != f.metadata.end(), "checkpoint '", f.path, "': metadata has no 'vocab'");
  if (vocab_utf8) *vocab_utf8 = v->second;
  return c;
}

TrainState load_checkpoint(const std::string& path, MixedPrecisionOptimizer& opt, const nn::NamedTensors& params,
                           const parallel::ShardMaps* tp_maps) {
  // 1. The manifest, every piece verified: train state, loss scale, the shard files.
  const std::string index_path = optimizer_path(path);
  nn::SafetensorsFile index = committed_manifest(path);
  LOOM_CHECK(index.contains("train.data_rng") && index.contains("train.step") && index.metadata.count("shards"),
             "checkpoint '", index_path, "': not an optimizer index (missing train.data_rng, train.step or shards)");
  TrainState s{};
  std::vector<int64_t> rng = index.at("train.data_rng").to_vector<int64_t>();
  LOOM_CHECK(rng.size() == 4, "checkpoint '", index_path, "': train.data_rng has ", rng.size(), " words, not 4");
  for (size_t i = 0; i < 4; ++i) s.data_rng[i] = uint64_t(rng[i]);
  s.step = index.at("train.step").item<int64_t>();
  // Written since dropout became counter-based; a checkpoint from before resumes its masks from 0.
  if (index.contains("train.dropout_offset"))
    s.dropout_offset = uint64_t(index.at("train.dropout_offset").item<int64_t>());
  if (opt.scaler()) {
    LOOM_CHECK(index.contains("scaler.scale"), "checkpoint '", index_path, "' has no loss-scaler state; it was "
               "written by a run without fp16 loss scaling");
    opt.scaler()->load_state_dict({{"scale", index.at("scaler.scale")},
                                   {"growth_tracker", index.at("scaler.growth_tracker")}});
  }

  // 2. Every fragment in every shard: "<kind>/<param name>/<first element>".
  using Fragment = OptimizerFragment;
  std::map<std::pair<std::string, std::string>, std::vector<Fragment>> fragments;  // (kind, name) -> pieces
  const std::filesystem::path dir = std::filesystem::path(index_path).parent_path();
  std::stringstream list(index.metadata.at("shards"));
  for (std::string file; std::getline(list, file, ',');) {
    nn::SafetensorsFile shard = nn::load_safetensors((dir / file).string());
    check_step(shard, index);
    for (auto& [key, t] : shard.tensors) {
      size_t a = key.find('/'), b = key.rfind('/');
      const std::string first = b == std::string::npos ? "" : key.substr(b + 1);
      LOOM_CHECK(a != std::string::npos && b > a && !first.empty() && first.size() <= 18 &&
                     first.find_first_not_of("0123456789") == std::string::npos,
                 "checkpoint '", shard.path, "': unexpected tensor name '", key,
                 "' (expected <kind>/<param name>/<first element>)");
      fragments[{key.substr(0, a), key.substr(a + 1, b - a - 1)}].push_back({std::stoll(first), t, shard.path});
    }
  }

  // 3. Each of this rank's main params: copy in the overlap of every fragment
  //    of its param, and check that together they cover it.
  auto names = names_by_tensor(params);
  for (size_t i = 0; i < opt.main_params().size(); ++i) {
    const MainParam& m = opt.main_params()[i];
    const AdamWState& st = opt.adam_state(i);
    const std::string name = name_of(m, names);
    const Tensor dst[] = {m.main, st.exp_avg, st.exp_avg_sq};
    if (tp_maps) {  // a tp shard: the whole tensor joined from the fragments, this rank's elements cut out of it
      const parallel::ShardMap& map = tp_maps->at(name);
      for (int k = 0; k < 3; ++k) {
        Tensor whole = join_fragments(fragments[{kKinds[k], name}], numel_of(map.full_shape),
                                      str(kKinds[k], "/", name), index_path);
        ops::copy_(dst[k], ops::narrow(parallel::cut_shard(whole, map), 0, m.start, m.end - m.start));
      }
      const auto& steps = fragments[{"step", name}];
      LOOM_CHECK(!steps.empty(), "checkpoint '", index_path, "': no step/", name, " (AdamW's step count)");
      ops::copy_(st.step, steps.front().t);
      continue;
    }
    for (int k = 0; k < 3; ++k) {
      // Fragments may overlap: a tied weight's two pipeline copies are both
      // saved (bit-identical). Count each element once.
      std::vector<char> seen(size_t(m.end - m.start), 0);
      for (const Fragment& f : fragments[{kKinds[k], name}]) {
        LOOM_CHECK(f.start >= 0 && f.start + f.t.numel() <= m.model_param.numel(), "checkpoint '", f.file, "': ",
                   kKinds[k], "/", name, "/", f.start, " holds ", f.t.numel(), " elements from ", f.start,
                   ", past the end of ", name, " ", m.model_param.describe(), "; is this another model's checkpoint?");
        const int64_t lo = std::max(m.start, f.start), hi = std::min(m.end, f.start + f.t.numel());
        if (lo >= hi) continue;
        LOOM_CHECK(f.t.dtype() == kFloat32, "checkpoint '", f.file, "': ", kKinds[k], "/", name, " is ",
                   f.t.describe(), ", expected float32");
        ops::copy_(ops::narrow(dst[k], 0, lo - m.start, hi - lo), ops::narrow(f.t, 0, lo - f.start, hi - lo));
        std::fill(seen.begin() + (lo - m.start), seen.begin() + (hi - m.start), 1);
        if (k == 0) {  // the AdamW step travels with the main param
          const auto& steps = fragments[{"step", name}];
          auto sf = std::find_if(steps.begin(), steps.end(), [&](const Fragment& x) { return x.start == f.start; });
          LOOM_CHECK(sf != steps.end(), "checkpoint '", f.file, "': main/", name, "/", f.start,
                     " has no step/", name, "/", f.start, " beside it (AdamW's step count)");
          ops::copy_(st.step, sf->t);
        }
      }
      const int64_t covered = std::count(seen.begin(), seen.end(), 1);
      LOOM_CHECK(covered == m.end - m.start, "checkpoint '", index_path, "': ", kKinds[k], " of ", name,
                 " elements [", m.start, ", ", m.end, ") is covered by ", covered, " elements of the listed shards (",
                 index.metadata.at("shards"), "); is a shard file missing, or is this another model?");
    }
  }
  opt.refresh_model_params();
  return s;
}

}  // namespace loom::optim
