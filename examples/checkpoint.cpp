#include "examples/checkpoint.h"

#include "nn/safetensors.h"

namespace loom::train {

std::string optimizer_path(const std::string& model_path) {
  const std::string ext = ".safetensors";
  std::string base = model_path;
  if (base.size() > ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0)
    base.resize(base.size() - ext.size());
  return base + ".optim" + ext;
}

void save_checkpoint(const std::string& path, const nn::GPT& model, const std::string& vocab_utf8,
                     const optim::Optimizer& opt, const TrainState& state) {
  const nn::GPTConfig& c = model.config();
  std::map<std::string, std::string> meta = {
      {"format", "loom-gpt"},
      {"vocab_size", std::to_string(c.vocab_size)},
      {"block_size", std::to_string(c.block_size)},
      {"n_layer", std::to_string(c.n_layer)},
      {"n_head", std::to_string(c.n_head)},
      {"n_embd", std::to_string(c.n_embd)},
      {"dropout", std::to_string(c.dropout)},
      {"seed", std::to_string(c.seed)},
      {"vocab", vocab_utf8},
      {"step", std::to_string(state.step)},
  };
  // Optimizer file first: a model file never points at a missing optimizer state.
  nn::NamedTensors ostate = opt.state_dict();
  std::vector<int64_t> rng(state.data_rng.begin(), state.data_rng.end());
  ostate.push_back({"train.data_rng", from_vector(rng)});
  ostate.push_back({"train.step", from_vector(std::vector<int64_t>{state.step})});
  nn::save_safetensors(optimizer_path(path), ostate, {{"format", "loom-optimizer"}});
  nn::save_safetensors(path, model.named_parameters(), meta);
}

static int64_t meta_int(const nn::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  LOOM_CHECK(it != f.metadata.end(), "checkpoint '", f.path, "': metadata has no '", key, "'");
  try {
    return std::stoll(it->second);
  } catch (...) {
    throw Error(str("checkpoint '", f.path, "': metadata '", key, "' = '", it->second, "' is not an integer"));
  }
}

nn::GPTConfig load_config(const std::string& path, std::string* vocab_utf8) {
  nn::SafetensorsFile f = nn::load_safetensors(path);
  nn::GPTConfig c;
  c.vocab_size = meta_int(f, "vocab_size");
  c.block_size = meta_int(f, "block_size");
  c.n_layer = meta_int(f, "n_layer");
  c.n_head = meta_int(f, "n_head");
  c.n_embd = meta_int(f, "n_embd");
  c.seed = uint64_t(meta_int(f, "seed"));
  auto d = f.metadata.find("dropout");
  if (d != f.metadata.end()) c.dropout = std::stod(d->second);
  auto v = f.metadata.find("vocab");
  LOOM_CHECK(v != f.metadata.end(), "checkpoint '", path, "': metadata has no 'vocab'");
  if (vocab_utf8) *vocab_utf8 = v->second;
  return c;
}

TrainState load_checkpoint(const std::string& path, nn::GPT& model, optim::Optimizer& opt) {
  nn::SafetensorsFile f = nn::load_safetensors(path);
  model.load_state_dict(f.tensors, /*strict=*/true);
  nn::SafetensorsFile o = nn::load_safetensors(optimizer_path(path));
  nn::NamedTensors ostate;
  TrainState s{};
  for (auto& [name, t] : o.tensors) {
    if (name == "train.data_rng") {
      std::vector<int64_t> v = t.to_vector<int64_t>();
      LOOM_CHECK(v.size() == 4, "checkpoint '", o.path, "': train.data_rng has ", v.size(), " words, not 4");
      for (size_t i = 0; i < 4; ++i) s.data_rng[i] = uint64_t(v[i]);
    } else if (name == "train.step") {
      s.step = t.item<int64_t>();
    } else {
      ostate.push_back({name, t});
    }
  }
  LOOM_CHECK(o.contains("train.data_rng") && o.contains("train.step"), "checkpoint '", o.path,
             "': missing train.data_rng or train.step");
  opt.load_state_dict(ostate);
  return s;
}

}  // namespace loom::train
