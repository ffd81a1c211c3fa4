// Folders transformers 5 wrote, against loom, with no Python: tests/hf/make_fixtures.py
// (run by hand in a venv with a current transformers; tests/hf/README.md) saved
// small random GPT2LMHeadModel and LlamaForCausalLM folders and the logits each
// gives on fixed ids, committed under tests/hf/fixtures/ (VERSIONS names the
// packages). loom must read their 5.x config.json ("rope_parameters", "dtype",
// "head_dim") and give the same logits. The live tests against transformers
// 4.40 (test_hf_checkpoint, test_hf_llama) check the other direction too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "hf_folder.h"
#include "nn/hf_checkpoint.h"
#include "nn/hf_config.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(LOOM_TEST_DATA_DIR) / "hf" / "fixtures";

nlohmann::json config_of(const fs::path& folder) {
  std::ifstream in(folder / "config.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST(HfTransformers5Fixtures, WereWrittenByTransformers5InItsNewFormat) {
  std::ifstream versions(kFixtures / "VERSIONS");
  std::string line;
  std::getline(versions, line);
  EXPECT_NE(line.find(", transformers 5."), std::string::npos) << line;
  for (const char* model : {"llama-gqa", "llama-mqa", "llama-bf16", "mixtral-top2", "mixtral-top1"}) {
    // (the Llama family's keys that moved: what loom read wrong before issue 48)
    const nlohmann::json c = config_of(kFixtures / model);
    EXPECT_FALSE(c.contains("rope_theta")) << model;
    EXPECT_TRUE(c.contains("rope_parameters")) << model;
    EXPECT_FALSE(c.contains("torch_dtype")) << model;
    EXPECT_TRUE(c.contains("dtype")) << model;
  }
}

TEST(HfTransformers5Fixtures, LoadWithTheLogitsTransformersGaveTo1e5) {
  struct Want {
    std::string model;
    std::string family;
    int64_t heads, kv_heads;
    double rope_base;
    bool tied;
  };
  for (const Want& w : {Want{"gpt2-odd", "gpt2", 3, 3, 10000.0, true},
                        Want{"llama-gqa", "llama", 6, 2, 500000.0, false},
                        Want{"llama-mqa", "llama", 3, 1, 10000.0, true},
                        Want{"llama-bf16", "llama", 6, 2, 1000000.0, false}}) {
    SCOPED_TRACE(w.model);
    const test::HfReference ref = test::hf_reference(kFixtures / (w.model + ".reference.safetensors"));
    const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kFixtures / w.model).string());
    EXPECT_EQ(nn::hf_family(hf.cfg), w.family);
    EXPECT_EQ(hf.cfg.vocab_size, 37);
    EXPECT_EQ(hf.cfg.block_size, 12);
    EXPECT_EQ(hf.cfg.n_embd, 24);
    EXPECT_EQ(hf.cfg.n_head, w.heads);
    EXPECT_EQ(hf.cfg.kv_heads(), w.kv_heads);
    EXPECT_EQ(hf.cfg.tied_embeddings, w.tied);
    if (w.family == "llama") {
      EXPECT_EQ(hf.cfg.rope_base, w.rope_base);
    }
    auto model = test::gpt_with(hf.cfg, hf.state);
    const Tensor logits = model->forward(ref.ids);
    ASSERT_EQ(logits.shape(), ref.logits.shape());
    const double err = test::max_abs(ops::sub(logits, ref.logits)), scale = test::max_abs(ref.logits);
    EXPECT_LE(err, 1e-5 * scale) << "max |loom - transformers| " << err << ", max |logit| " << scale;
    EXPECT_NEAR(nn::cross_entropy_loss(logits, ref.targets).item<double>(), ref.loss, 1e-5 * ref.loss);
  }
}

// transformers 5 holds a Mixtral's experts fused ([E, 2I, C] and [E, C, I]) and writes them per expert, as
// 4.x did (nn/hf_mixtral.h): loom reads its folders with the logits it gave.
TEST(HfTransformers5Fixtures, MixtralLoadsWithTheLogitsTransformersGaveTo1e5) {
  struct Want {
    std::string model;
    int64_t experts, per_token, hidden;
    double rope_base;
  };
  for (const Want& w : {Want{"mixtral-top2", 4, 2, 20, 1e6}, Want{"mixtral-top1", 3, 1, 36, 1e4}}) {
    SCOPED_TRACE(w.model);
    const test::HfReference ref = test::hf_reference(kFixtures / (w.model + ".reference.safetensors"));
    const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kFixtures / w.model).string());
    EXPECT_EQ(nn::hf_family(hf.cfg), "mixtral");
    EXPECT_EQ(hf.cfg.moe.experts, w.experts);
    EXPECT_EQ(hf.cfg.moe.experts_per_token, w.per_token);
    EXPECT_EQ(hf.cfg.ffn_hidden(), w.hidden);
    EXPECT_EQ(hf.cfg.rope_base, w.rope_base);
    auto model = test::gpt_with(hf.cfg, hf.state);
    const Tensor logits = model->forward(ref.ids);
    ASSERT_EQ(logits.shape(), ref.logits.shape());
    const double err = test::max_abs(ops::sub(logits, ref.logits)), scale = test::max_abs(ref.logits);
    EXPECT_LE(err, 1e-5 * scale) << "max |loom - transformers| " << err << ", max |logit| " << scale;
    std::printf("%s: max |loom - transformers 5| %.3g, max |logit| %.3g\n", w.model.c_str(), err, scale);
    EXPECT_NEAR(nn::cross_entropy_loss(logits, ref.targets).item<double>(), ref.loss, 1e-5 * ref.loss);
  }
}

TEST(HfTransformers5Fixtures, ShardedFoldersHoldTheSameModel) {
  for (const std::string model : {"gpt2-odd", "llama-gqa", "mixtral-top2"}) {
    SCOPED_TRACE(model);
    const fs::path sharded = kFixtures / (model + "-sharded");
    EXPECT_GE(test::shards_of(sharded).size(), 2u);
    test::expect_same_tensors(nn::load_hf_checkpoint(sharded.string()).state,
                              nn::load_hf_checkpoint((kFixtures / model).string()).state);
  }
}

// A stranger's index may name any path as a shard; loom reads only the
// folder's own files: a name with a '/' (or . and ..) is refused, naming the
// index, the tensor and the name, before anything is opened.
TEST(HfTransformers5Fixtures, AnIndexThatNamesAFileOutsideTheFolderIsRefused) {
  const fs::path dir = fs::temp_directory_path() / ("loom_hf_index_" + std::to_string(::getpid()));
  for (const std::string shard : {"../model-00001-of-00004.safetensors", "/etc/hostname", ".."}) {
    SCOPED_TRACE(shard);
    fs::remove_all(dir);
    fs::copy(kFixtures / "gpt2-odd-sharded", dir);
    nlohmann::json index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
    const std::string first = index["weight_map"].begin().key();
    index["weight_map"][first] = shard;
    std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
    try {
      nn::load_hf_checkpoint(dir.string());
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json: tensor '" + first + "' maps to '" + shard +
                                           "', not a file name of the folder"),
                std::string::npos)
          << e.what();
    }
  }
  fs::remove_all(dir);
}
