// Hugging Face folders <-> loom's GPT (layout and name map in hf_checkpoint.h).
#include "nn/hf_checkpoint.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "nn/hf_config.h"
#include "nn/hf_mixtral.h"
#include "nn/json_file.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// A new, empty folder "DIR.loom-WHAT-XXXXXX" beside DIR (mkdtemp: the name is unique), with the
// permissions any new folder gets (mkdtemp's 0700 would become the exported folder's).
fs::path fresh_sibling(const std::string& dir, const char* what) {
  std::string name = dir + ".loom-" + what + "-XXXXXX";
  LOOM_CHECK(::mkdtemp(name.data()) != nullptr, "save_hf_checkpoint: cannot make a folder beside ", dir, ": ",
             std::strerror(errno));
  const mode_t mask = ::umask(0);
  ::umask(mask);
  fs::permissions(name, fs::perms(0777 & ~mask));
  return name;
}

constexpr bool kConv1D = true;  // HF's GPT-2 keeps these weights as [in, out]

// GPT-2 (transformers' GPT2LMHeadModel): loom's nanoGPT names are GPT-2's own
// under "transformer.", with blocks.i -> h.i.
std::vector<HfName> gpt2_names(const GPTConfig& cfg) {
  const int64_t V = cfg.vocab_size, P = cfg.block_size, C = cfg.n_embd;
  std::vector<HfName> t = {{"wte.weight", "transformer.wte.weight", {V, C}},
                           {"wpe.weight", "transformer.wpe.weight", {P, C}}};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string l = str("blocks.", i, "."), h = str("transformer.h.", i, ".");
    auto row = [&](const std::string& name, Shape shape, bool transposed = false) {
      t.push_back({l + name, h + name, std::move(shape), transposed});
    };
    row("ln_1.weight", {C});
    row("ln_1.bias", {C});
    row("attn.c_attn.weight", {3 * C, C}, kConv1D);  // HF: [C, 3C]
    row("attn.c_attn.bias", {3 * C});
    row("attn.c_proj.weight", {C, C}, kConv1D);
    row("attn.c_proj.bias", {C});
    row("ln_2.weight", {C});
    row("ln_2.bias", {C});
    row("mlp.c_fc.weight", {4 * C, C}, kConv1D);  // HF: [C, 4C]
    row("mlp.c_fc.bias", {4 * C});
    row("mlp.c_proj.weight", {C, 4 * C}, kConv1D);  // HF: [4C, C]
    row("mlp.c_proj.bias", {C});
  }
  t.push_back({"ln_f.weight", "transformer.ln_f.weight", {C}});
  t.push_back({"ln_f.bias", "transformer.ln_f.bias", {C}});
  return t;
}

// Llama (transformers' LlamaForCausalLM): nn.Linear weights [out, in], as
// loom's; c_attn's rows are q, k, v one after the other.
std::vector<HfName> llama_names(const GPTConfig& cfg) {
  const int64_t V = cfg.vocab_size, C = cfg.n_embd, F = cfg.ffn_hidden(), kv = cfg.kv_heads() * (C / cfg.n_head);
  std::vector<HfName> t = {{"wte.weight", "model.embed_tokens.weight", {V, C}}};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string l = str("blocks.", i, "."), h = str("model.layers.", i, ".");
    const Shape qkv = {C + 2 * kv, C};
    t.push_back({l + "ln_1.weight", h + "input_layernorm.weight", {C}});
    t.push_back({l + "attn.c_attn.weight", h + "self_attn.q_proj.weight", qkv, false, 0, C});        // [C, C]
    t.push_back({l + "attn.c_attn.weight", h + "self_attn.k_proj.weight", qkv, false, C, kv});       // [kv, C]
    t.push_back({l + "attn.c_attn.weight", h + "self_attn.v_proj.weight", qkv, false, C + kv, kv});  // [kv, C]
    t.push_back({l + "attn.c_proj.weight", h + "self_attn.o_proj.weight", {C, C}});
    t.push_back({l + "ln_2.weight", h + "post_attention_layernorm.weight", {C}});
    if (cfg.moe.experts > 0) {  // Mixtral: the experts in the MLP's place
      append_mixtral_names(cfg, l, h, t);
      continue;
    }
    t.push_back({l + "mlp.c_gate.weight", h + "mlp.gate_proj.weight", {F, C}});
    t.push_back({l + "mlp.c_fc.weight", h + "mlp.up_proj.weight", {F, C}});
    t.push_back({l + "mlp.c_proj.weight", h + "mlp.down_proj.weight", {C, F}});
  }
  t.push_back({"ln_f.weight", "model.norm.weight", {C}});
  if (!cfg.tied_embeddings) t.push_back({"lm_head.weight", "lm_head.weight", {V, C}});
  return t;
}

// Tensors HF's files may hold that are not parameters: GPT-2's causal-mask
// buffers (older transformers saved them) and Llama's RoPE frequencies.
bool is_buffer(const std::string& hf) {
  auto ends_with = [&](const char* s) { return hf.size() >= std::strlen(s) && hf.ends_with(s); };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with(".rotary_emb.inv_freq");
}

// HF's shape of n's tensor: its rows of loom's, transposed when HF stores it so.
Shape hf_shape(const HfName& n) {
  Shape s = n.loom_shape;
  if (n.row_count > 0) s[0] = n.row_count;
  return n.transposed ? Shape(s.rbegin(), s.rend()) : s;
}

struct Found {
  Tensor tensor;
  std::string file;
};

// Every tensor of the folder by HF name, with the file it came from: the one
// model.safetensors, or each shard its index lists (which must hold what the
// index says it holds).
std::map<std::string, Found> read_tensors(const fs::path& dir) {
  std::map<std::string, Found> found;
  auto add_file = [&](const fs::path& file) {
    SafetensorsFile f = load_safetensors(file.string());
    for (auto& [name, tensor] : f.tensors) found[name] = {tensor, file.string()};
    return f;
  };
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    add_file(single);
    return found;
  }
  LOOM_CHECK(fs::exists(index), "load_hf_checkpoint: ", dir.string(),
             " holds neither model.safetensors nor model.safetensors.index.json");
  const Json j = read_json_file(index.string(), "load_hf_checkpoint");
  LOOM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "load_hf_checkpoint: ",
             index.string(), ": no \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> the tensors the index puts there
  for (auto& [name, file] : j["weight_map"].items()) {
    LOOM_CHECK(file.is_string(), "load_hf_checkpoint: ", index.string(), ": tensor '", name, "' maps to ", file.dump(),
               ", not a file name");
    by_shard[file.get<std::string>()].push_back(name);
  }
  for (const auto& [shard, names] : by_shard) {
    // A shard is a file of the folder ("model-00001-of-00002.safetensors"): a path ("../x", "/etc/x")
    // in a stranger's index would have loom read elsewhere.
    LOOM_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
               "load_hf_checkpoint: ", index.string(), ": tensor '", names.front(), "' maps to '", shard,
               "', not a file name of the folder");
    const fs::path file = dir / shard;
    LOOM_CHECK(fs::exists(file), "load_hf_checkpoint: ", index.string(), " lists the shard ", shard, " (tensor '",
               names.front(), "' and ", names.size() - 1, " more), which is missing: ", file.string());
    SafetensorsFile f = add_file(file);
    for (const std::string& name : names)
      LOOM_CHECK(f.contains(name), "load_hf_checkpoint: ", file.string(), ": tensor '", name, "' is missing (",
                 index.string(), " puts it in this shard)");
  }
  return found;
}

}  // namespace

std::vector<HfName> hf_names(const GPTConfig& cfg) {
  return hf_family(cfg) == "gpt2" ? gpt2_names(cfg) : llama_names(cfg);  // Mixtral: Llama's with experts
}

HfCheckpoint load_hf_checkpoint(const std::string& dir_name) {
  const fs::path dir(dir_name);
  LOOM_CHECK(fs::is_directory(dir), "load_hf_checkpoint: ", dir_name, " is not a directory");
  const fs::path config = dir / "config.json";
  LOOM_CHECK(fs::exists(config), "load_hf_checkpoint: ", dir_name, " has no config.json");
  HfCheckpoint ckpt{read_hf_config(config.string()), {}};
  std::map<std::string, Found> found = read_tensors(dir);
  // GPT2Model's own save (the hub's openai-community/gpt2) has no "transformer." prefix.
  const bool bare = !found.contains("transformer.wte.weight") && found.contains("wte.weight");
  auto hf_key = [&](const std::string& hf) { return bare ? hf.substr(std::strlen("transformer.")) : hf; };
  const std::string where = [&]() {  // before the loop below empties `found`
    std::set<std::string> files;
    for (const auto& [name, f] : found) files.insert(f.file);
    return files.size() == 1 ? *files.begin() : str(dir_name, " (", files.size(), " shards)");
  }();
  const std::vector<HfName> names = hf_names(ckpt.cfg);
  std::map<int64_t, Tensor> pieces;  // row_begin -> rows of the parameter being assembled (Llama's q, k, v)
  for (size_t i = 0; i < names.size(); ++i) {
    const HfName& n = names[i];
    auto it = found.find(hf_key(n.hf));
    LOOM_CHECK(it != found.end(), "load_hf_checkpoint: ", where, ": tensor '", hf_key(n.hf),
               "' is missing (loom's ", n.loom, ", ", n.loom_shape, ")");
    const Shape want = hf_shape(n);
    const Tensor& t = it->second.tensor;
    LOOM_CHECK(t.shape() == want, "load_hf_checkpoint: ", it->second.file, ": tensor '", it->first, "' is ",
               t.shape(), ", but ", config.string(), " makes it ", want);
    Tensor w = ops::to(t, kFloat32);
    if (n.transposed) w = ops::transpose(w, 0, 1);
    pieces[n.row_begin] = ops::clone(w);
    found.erase(it);
    if (i + 1 < names.size() && names[i + 1].loom == n.loom) continue;  // more rows of this parameter follow
    std::vector<Tensor> rows;  // in row order
    for (auto& [row_begin, piece] : pieces) rows.push_back(piece);
    ckpt.state.emplace_back(n.loom, rows.size() == 1 ? rows[0] : ops::cat(rows, 0));
    pieces.clear();
  }
  const std::string family = hf_family(ckpt.cfg) == "llama" ? "Llama" : hf_family(ckpt.cfg) == "mixtral" ? "Mixtral" : "GPT-2";
  const Tensor& wte = ckpt.state.front().second;
  for (const auto& [name, f] : found) {
    if (is_buffer(name)) continue;
    if (name == "lm_head.weight" && ckpt.cfg.tied_embeddings) {  // a tied head saved anyway: it must be wte
      const Tensor head = ops::to(f.tensor, kFloat32);
      LOOM_CHECK(head.shape() == wte.shape() && std::memcmp(head.raw_data(), wte.raw_data(), wte.nbytes()) == 0,
                 "load_hf_checkpoint: ", f.file, ": lm_head.weight differs from ", names.front().hf, "; ",
                 config.string(), " ties them (tie_word_embeddings)");
      continue;
    }
    throw Error(str("load_hf_checkpoint: ", f.file, ": tensor '", name, "' ", f.tensor.shape(),
                    " is not a parameter of loom's ", ckpt.cfg.n_layer, "-layer ", family, " (", config.string(), ")"));
  }
  return ckpt;
}

void save_hf_checkpoint(const std::string& dir_name, const GPTConfig& cfg, const NamedTensors& state,
                        int64_t max_shard_bytes, const std::string& tokenizer_json) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  // HF's tensors, in loom's order, cut into shards of at most max_shard_bytes.
  std::vector<NamedTensors> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  DType dtype = kFloat32;
  for (const HfName& n : hf_names(cfg)) {
    auto it = by_name.find(n.loom);
    LOOM_CHECK(it != by_name.end(), "save_hf_checkpoint: the state has no '", n.loom, "'");
    LOOM_CHECK(it->second.shape() == n.loom_shape, "save_hf_checkpoint: '", n.loom, "' is ", it->second.shape(),
               ", expected ", n.loom_shape);
    Tensor t = ops::to(it->second, kCPU);
    dtype = t.dtype();
    if (n.row_count > 0) t = ops::narrow(t, 0, n.row_begin, n.row_count);
    t = ops::clone(n.transposed ? ops::transpose(t, 0, 1) : t);
    const int64_t bytes = int64_t(t.nbytes());
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(n.hf, t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  // Written whole in a folder of its own beside DIR, then swapped in: a crash leaves the old folder or
  // the new one, and a failed write (a full disk, a file-size limit) the old one and no scratch. Both
  // scratch names are loom's and new (DIR.loom-export-XXXXXX), so a user's DIR.tmp or DIR.old beside it
  // is never touched.
  const fs::path dir(dir_name), tmp = fresh_sibling(dir_name, "export");
  const auto write = [&] {
    {
      std::ofstream out(tmp / "config.json");
      out << hf_config_json(cfg, dtype);
      LOOM_CHECK(out.good(), "save_hf_checkpoint: cannot write ", (tmp / "config.json").string());
    }
    const std::map<std::string, std::string> format = {{"format", "pt"}};  // from_pretrained requires it
    if (shards.size() == 1) {
      save_safetensors((tmp / "model.safetensors").string(), shards[0], format);
    } else {
      Json index;
      index["metadata"]["total_size"] = total_bytes;
      const size_t M = shards.size();
      for (size_t k = 0; k < M; ++k) {
        char file[64];
        std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", k + 1, M);
        save_safetensors((tmp / file).string(), shards[k], format);
        for (const auto& [name, t] : shards[k]) index["weight_map"][name] = file;
      }
      std::ofstream out(tmp / "model.safetensors.index.json");
      out << index.dump(2) << "\n";
      LOOM_CHECK(out.good(), "save_hf_checkpoint: cannot write ", (tmp / "model.safetensors.index.json").string());
    }
    if (!tokenizer_json.empty()) fs::copy_file(tokenizer_json, tmp / "tokenizer.json");
  };
  try {
    write();
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  const fs::path old = fresh_sibling(dir_name, "old");
  if (fs::exists(dir)) fs::rename(dir, old);  // onto the empty folder fresh_sibling made
  fs::rename(tmp, dir);
  fs::remove_all(old);
}

}  // namespace loom::nn
