// config.json as transformers 4.x and 5.x write it (nn/hf_config.h), with no
// Python: each test writes a config.json (a Llama as LlamaConfig(...).save_pretrained
// of transformers 5.25 writes it, then one key changed) and reads it with
// read_hf_config. transformers 5 moved RoPE's θ into "rope_parameters" and
// renamed "torch_dtype" to "dtype": loom must read the new places, refuse what
// it cannot compute by name, refuse two keys that disagree naming both values,
// and write a folder that both 4.40 and 5.x read as the same model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "error_of.h"
#include "nn/arch_metadata.h"
#include "nn/hf_checkpoint.h"
#include "nn/hf_config.h"

using namespace loom;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// LlamaConfig(vocab_size=41, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
// num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16, rope_theta=500000.0)
// .save_pretrained(...) in transformers 5.25: no top-level rope_theta, "dtype", "head_dim".
Json llama5() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu",
    "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48, "max_position_embeddings": 16,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "tie_word_embeddings": false,
    "transformers_version": "5.25.0", "use_cache": true, "vocab_size": 41})");
}

// GPT2Config(vocab_size=41, n_positions=16, n_embd=32, n_layer=2, n_head=4, *_pdrop=0) in 5.25.
Json gpt2_5() {
  return Json::parse(R"({
    "activation_function": "gelu_new", "add_cross_attention": false, "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.0, "bos_token_id": 50256, "dtype": "float32", "embd_pdrop": 0.0, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 32, "n_head": 4,
    "n_inner": null, "n_layer": 2, "n_positions": 16, "reorder_and_upcast_attn": false, "resid_pdrop": 0.0,
    "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true, "tie_word_embeddings": true,
    "transformers_version": "5.25.0", "use_cache": true, "vocab_size": 41})");
}

// config.json in a scratch folder, removed at the end of the test.
struct ConfigFile {
  fs::path dir, path;
  explicit ConfigFile(const Json& c) {
    dir = fs::temp_directory_path() / ("loom_hf_config_" + std::to_string(getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    path = dir / "config.json";
    std::ofstream(path) << c.dump(2);
  }
  ~ConfigFile() { fs::remove_all(dir); }
};

nn::GPTConfig read(const Json& c) { return nn::read_hf_config(ConfigFile(c).path.string()); }

// The error reading c, with the scratch file's path replaced by "PATH".
std::string error_reading(const Json& c) {
  const ConfigFile f(c);
  std::string e = test::error_of([&] { nn::read_hf_config(f.path.string()); });
  const size_t at = e.find(f.path.string());
  if (at != std::string::npos) e.replace(at, f.path.string().size(), "PATH");
  return e;
}

}  // namespace

TEST(HfConfig, ReadsRopeThetaFromTransformers5sRopeParameters) {
  const nn::GPTConfig cfg = read(llama5());  // no top-level rope_theta: 10000 before this fix
  EXPECT_EQ(cfg.rope_base, 500000.0);
  EXPECT_EQ(cfg.kv_heads(), 2);
  EXPECT_FALSE(cfg.tied_embeddings);
  // 4.x's form reads the same; so do both forms together when they agree, and 4.x's "type" spelling.
  Json v4 = llama5();
  v4.erase("rope_parameters");
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = nullptr;
  EXPECT_EQ(read(v4).rope_base, 500000.0);
  Json both = llama5();
  both["rope_theta"] = 500000.0;
  EXPECT_EQ(read(both).rope_base, 500000.0);
  Json type = llama5();
  type["rope_parameters"] = {{"type", "default"}, {"rope_theta", 250000.0}};
  EXPECT_EQ(read(type).rope_base, 250000.0);
  // Nowhere: LlamaConfig's default θ.
  Json none = llama5();
  none.erase("rope_parameters");
  EXPECT_EQ(read(none).rope_base, 10000.0);
  // Every layer full attention, as 5.x would name it: the same model.
  Json layers = llama5();
  layers["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(read(layers).n_layer, 2);
}

TEST(HfConfig, RefusesScaledRopeTypesNamingTheFileKeyAndValue) {
  const std::pair<Json, std::string> cases[] = {
      {{{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}},
       R"("rope_parameters": {"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,"low_freq_factor":1.0,)"
       R"("high_freq_factor":4.0,"original_max_position_embeddings":8192}: rope_type "llama3" is not loom's Llama)"},
      {{{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 10000.0}},
       R"("rope_parameters": {"rope_type":"yarn","factor":4.0,"rope_theta":10000.0}: rope_type "yarn" is not)"},
      {{{"rope_type", "linear"}, {"factor", 2.0}},
       R"("rope_parameters": {"rope_type":"linear","factor":2.0}: rope_type "linear")"},
      {{{"type", "dynamic"}, {"factor", 2.0}},
       R"("rope_parameters": {"type":"dynamic","factor":2.0}: rope_type "dynamic")"}};
  for (const auto& [rope, want] : cases) {
    Json c = llama5();
    c["rope_parameters"] = rope;
    const std::string e = error_reading(c);
    EXPECT_EQ(e.find("read_hf_config: PATH: " + want), 0u) << e;
    EXPECT_NE(e.find("which has \"default\" (plain RoPE; loom implements no position scaling"), std::string::npos)
        << e;
  }
  Json v4 = llama5();  // 4.x's key for the same thing
  v4["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const std::string e = error_reading(v4);
  EXPECT_EQ(e.find(R"(read_hf_config: PATH: "rope_scaling": {"type":"linear","factor":2.0}: rope_type "linear" )"
                   "is not loom's Llama"),
            0u) << e;
}

TEST(HfConfig, RefusesKeysThatDisagreeNamingBothValues) {
  Json theta = llama5();
  theta["rope_theta"] = 10000.0;  // 4.40 would read 10000, 5.x 500000
  EXPECT_EQ(error_reading(theta),
            R"(read_hf_config: PATH: "rope_theta": 10000.0 and "rope_parameters.rope_theta": 500000.0 disagree )"
            "(transformers 4.x reads the top-level rope_theta, 5.x the one in rope_parameters or rope_scaling): "
            "refusing to guess the model's RoPE base");
  for (Json c : {llama5(), gpt2_5()}) {
    c["torch_dtype"] = "bfloat16";
    EXPECT_EQ(error_reading(c), R"(read_hf_config: PATH: "torch_dtype": "bfloat16" and "dtype": "float32" disagree )"
                                "(transformers 4.x reads the first, 5.x the second)");
    c["torch_dtype"] = "float32";
    EXPECT_NO_THROW(read(c));
  }
}

TEST(HfConfig, RefusesLayerTypesOtherThanFullAttentionInEveryLayer) {
  for (const Json& types : {Json{"full_attention", "sliding_attention"}, Json{"full_attention"}}) {
    Json c = llama5();
    c["layer_types"] = types;
    EXPECT_EQ(error_reading(c), "read_hf_config: PATH: \"layer_types\": " + types.dump() +
                                    " is not loom's Llama, which has 2 x \"full_attention\" (causal attention over "
                                    "the whole block in every layer, no sliding window)");
  }
}

// The keys transformers 5 writes for GPT-2 (dtype, no torch_dtype) read as 4.x's did; absent,
// tie_word_embeddings is GPT-2's true and Llama's false, in 4.x and 5.x alike.
TEST(HfConfig, AbsentKeysTakeTheDefaultsOfBothTransformersVersions) {
  const nn::GPTConfig g = read(gpt2_5());
  EXPECT_EQ(nn::hf_family(g), "gpt2");
  EXPECT_EQ(g.n_embd, 32);
  Json gpt2 = gpt2_5(), llama = llama5();
  gpt2.erase("tie_word_embeddings");
  llama.erase("tie_word_embeddings");
  EXPECT_TRUE(read(gpt2).tied_embeddings);
  EXPECT_FALSE(read(llama).tied_embeddings);
  gpt2["tie_word_embeddings"] = false;
  EXPECT_NE(error_reading(gpt2).find("\"tie_word_embeddings\": false is not loom's GPT-2"), std::string::npos);
}

// loom's config.json carries each moved key in both places, so 4.40 (rope_theta, torch_dtype) and
// 5.x (rope_parameters, dtype) read the same model; special-token ids are null, not 1 and 2.
TEST(HfConfig, WritesEachMovedKeyWhereBothTransformersVersionsReadIt) {
  const nn::GPTConfig cfg = read(llama5());
  const Json c = Json::parse(nn::hf_config_json(cfg, kBFloat16));
  EXPECT_EQ(c["rope_theta"], 500000.0);
  EXPECT_EQ(c["rope_parameters"], (Json{{"rope_type", "default"}, {"rope_theta", 500000.0}}));
  EXPECT_TRUE(c["rope_scaling"].is_null());
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_EQ(c["dtype"], "bfloat16");
  EXPECT_EQ(c["head_dim"], 8);
  EXPECT_TRUE(c["bos_token_id"].is_null());
  EXPECT_TRUE(c["eos_token_id"].is_null());
  const nn::GPTConfig back = read(c);
  EXPECT_EQ(nn::arch_metadata(back), nn::arch_metadata(cfg));
  const Json g = Json::parse(nn::hf_config_json(read(gpt2_5()), kFloat32));
  EXPECT_EQ(g["torch_dtype"], "float32");
  EXPECT_EQ(g["dtype"], "float32");
  EXPECT_TRUE(g["eos_token_id"].is_null());
}

// A stranger's files: valid JSON with values of another type, a number no
// type holds (1e309: nlohmann's out_of_range, not a parse_error) and a float
// where an integer belongs (1e209: nlohmann's cast overflows, undefined
// behaviour that UBSan reports), both found by fuzz_tokenizer, are refused with loom's error naming the file - never the
// JSON library's own exception (which error_of would not catch: a failure).
TEST(HfConfig, StrangersFilesAreRefusedWithLoomsErrorNamingTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("loom_hf_strangers_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  for (const char* config : {R"({"model_type": "gpt2", "vocab_size": 1e309})",
                             R"({"model_type": "gpt2", "vocab_size": 1e209, "n_positions": 16})",
                             R"({"model_type": "llama", "hidden_size": 32, "rope_parameters": 5})",
                             R"({"model_type": "gpt2", "n_embd": "12"})"}) {
    const std::string path = write("config.json", config);
    const std::string e = test::error_of([&] { nn::read_hf_config(path); });
    EXPECT_NE(e.find(path), std::string::npos) << config << ": " << e;
  }
  write("config.json", gpt2_5().dump());
  for (const char* index : {R"({"weight_map": {"a": 1e309}})", R"({"weight_map": [1]})", R"([])"}) {
    const std::string path = write("model.safetensors.index.json", index);
    const std::string e = test::error_of([&] { nn::load_hf_checkpoint(dir.string()); });
    EXPECT_NE(e.find(path), std::string::npos) << index << ": " << e;
  }
  const std::string byte_level = R"("pre_tokenizer": {"type": "ByteLevel"})";
  for (const std::string& tokenizer :
       {std::string(R"({"model": 1})"), std::string(R"({"model": {"type": "BPE", "vocab": {"a": 1e309}}})"),
        R"({"model": {"type": "BPE", "vocab": {"a": 1e209}}, )" + byte_level + "}",
        R"({"model": {"type": "BPE", "vocab": {"a": "x"}}, )" + byte_level + "}",
        R"({"model": {"type": "BPE", "vocab": {}, "merges": [5]}, )" + byte_level + "}"}) {
    const std::string path = write("tokenizer.json", tokenizer);
    const std::string e = test::error_of([&] { data::BpeTokenizer::from_file(path); });
    EXPECT_NE(e.find(path), std::string::npos) << tokenizer << ": " << e;
  }
  fs::remove_all(dir);
}
