// Hugging Face Llama folders against transformers itself (nn/hf_checkpoint.h's
// Llama table). tests/hf/make_llama.py (the hf_llama_reference fixture) saved
// two random LlamaForCausalLM with save_pretrained - llama-gqa2 (2 kv heads of
// 4, rope_theta 500000, untied head; also sharded) and llama-mqa (1 kv head,
// rope_theta 10000, tied) - and the logits and loss each gives on fixed ids.
// loom loads them and must give the same numbers: that checks the name table,
// the q/k/v rows of loom's fused c_attn and that loom's RoPE is HF's
// rotate-half form. Then train_gpt trains from them, exports, and
// from_pretrained must give loom's loss. Bad folders fail naming the key, the
// file and the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "error_of.h"
#include "hf_folder.h"
#include "nn/arch_metadata.h"
#include "nn/hf_checkpoint.h"
#include "nn/hf_config.h"
#include "run_command.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

const fs::path kRef = LOOM_HF_REFERENCE_DIR;  // make_llama.py's output
const std::string kPython = LOOM_HF_PYTHON;   // the venv's python

using test::edit_config;
using test::error_of;

test::HfReference reference(const std::string& model) {
  return test::hf_reference(kRef / (model + ".reference.safetensors"));
}

struct Scratch : test::Scratch {
  explicit Scratch(const std::string& from) : test::Scratch(kRef, from) {}
};

std::string train_gpt() { return test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT); }

std::string error_loading(const fs::path& dir) {
  return error_of([&] { nn::load_hf_checkpoint(dir.string()); });
}

}  // namespace

TEST(HfLlama, LoadsTransformersLlamaWithTheSameLogitsAndLoss) {
  struct Want {
    std::string model;
    int64_t kv_heads;
    double rope_base, norm_eps;
    bool tied;
  };
  for (const Want& w : {Want{"llama-gqa2", 2, 500000.0, 1e-5, false}, Want{"llama-mqa", 1, 10000.0, 1e-6, true}}) {
    SCOPED_TRACE(w.model);
    const test::HfReference ref = reference(w.model);
    const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / w.model).string());
    EXPECT_EQ(nn::hf_family(hf.cfg), "llama");
    EXPECT_EQ(hf.cfg.n_layer, 2);
    EXPECT_EQ(hf.cfg.n_embd, 32);
    EXPECT_EQ(hf.cfg.n_head, 4);
    EXPECT_EQ(hf.cfg.kv_heads(), w.kv_heads);
    EXPECT_EQ(hf.cfg.ffn_hidden(), 48);
    EXPECT_EQ(hf.cfg.rope_base, w.rope_base);
    EXPECT_EQ(hf.cfg.norm_eps, w.norm_eps);
    EXPECT_EQ(hf.cfg.tied_embeddings, w.tied);
    EXPECT_EQ(hf.cfg.vocab_size, ref.logits.size(2));
    // wte, 2 x 7 block tensors (q, k, v fused in c_attn), ln_f (+ lm_head when untied).
    EXPECT_EQ(hf.state.size(), w.tied ? 16u : 17u);
    auto model = test::gpt_with(hf.cfg, hf.state);
    const Tensor logits = model->forward(ref.ids);
    ASSERT_EQ(logits.shape(), ref.logits.shape());
    // 1e-5 of the logits' scale, element by element.
    const double err = test::max_abs(ops::sub(logits, ref.logits)), scale = test::max_abs(ref.logits);
    EXPECT_LE(err, 1e-5 * scale) << "max |loom - transformers| " << err << ", max |logit| " << scale;
    const double loss = nn::cross_entropy_loss(logits, ref.targets).item<double>();
    EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
  }
}

TEST(HfLlama, ShardedFolderHoldsTheSameModelAndSaveLoadsBack) {
  ASSERT_GE(test::shards_of(kRef / "llama-gqa2-sharded").size(), 2u) << "save_pretrained did not shard";
  const nn::HfCheckpoint whole = nn::load_hf_checkpoint((kRef / "llama-gqa2").string());
  test::expect_same_tensors(nn::load_hf_checkpoint((kRef / "llama-gqa2-sharded").string()).state, whole.state);
  // loom's save: q, k and v cut out of c_attn and put back; the config read back is the same model.
  Scratch s("");
  for (const std::string model : {"llama-gqa2", "llama-mqa"}) {
    const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / model).string());
    nn::save_hf_checkpoint((s.dir / model).string(), hf.cfg, hf.state, 20000);
    EXPECT_GE(test::shards_of(s.dir / model).size(), 2u);
    const nn::HfCheckpoint back = nn::load_hf_checkpoint((s.dir / model).string());
    test::expect_same_tensors(back.state, hf.state);
    EXPECT_EQ(nn::arch_metadata(back.cfg), nn::arch_metadata(hf.cfg)) << model;
    EXPECT_EQ(back.cfg.block_size, hf.cfg.block_size);
    EXPECT_EQ(back.cfg.vocab_size, hf.cfg.vocab_size);
  }
}

// train_gpt --init-from each folder, 3 AdamW steps, --save and --export-hf
// (sharded); transformers' loss of the export must be loom's loss of the model
// it saved: the GQA untied one and the MQA tied one (its lm_head not stored).
TEST(HfLlama, TransformersReadsWhatTrainGptTrainedAndExported) {
  Scratch s("");
  const test::HfReference ref = reference("llama-gqa2");  // both references hold the same ids and targets
  std::map<std::string, double> loom_loss;
  std::string folders;
  for (const std::string model : {"llama-gqa2", "llama-mqa"}) {
    const fs::path out = s.dir / (model + "-exported"), ckpt = s.dir / (model + ".safetensors");
    const test::Exec run = test::run_command(
        train_gpt() + " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --init-from " + (kRef / model).string() +
        " --steps 3 --batch 4 --lr 1e-2 --warmup 0 --eval-every 0 --sample 0 --save " + ckpt.string() +
        " --export-hf " + out.string() + " --export-hf-shard-mb 0.02 2>&1");
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("(Hugging Face Llama, vocab 41)"), std::string::npos) << run.output;
    ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json")) << run.output;
    const nn::HfCheckpoint start = nn::load_hf_checkpoint((kRef / model).string());
    auto trained = test::gpt_with(start.cfg, nn::load_safetensors(ckpt.string()).tensors);
    loom_loss[out.string()] = test::loss_of(*trained, ref);
    EXPECT_GT(std::abs(loom_loss[out.string()] - reference(model).loss), 1e-3) << model << ": 3 steps changed nothing";
    folders += " " + out.string();
  }
  const test::Exec py = test::run_command(kPython + " " LOOM_TEST_DATA_DIR "/hf/hf_loss.py " +
                                          (kRef / "llama-gqa2.reference.safetensors").string() + folders + " 2>&1");
  ASSERT_EQ(py.status, 0) << py.output;
  const std::map<std::string, double> hf_loss = test::hf_losses(py.output);
  ASSERT_EQ(hf_loss.size(), 2u) << py.output;
  for (const auto& [folder, loss] : loom_loss) {
    ASSERT_TRUE(hf_loss.contains(folder)) << folder << "\n" << py.output;
    EXPECT_NEAR(hf_loss.at(folder), loss, 1e-5 * loss) << folder << ": transformers " << hf_loss.at(folder)
                                                       << ", loom " << loss;
  }
}

// One step at lr 1e-30 changes no fp32 bit: the checkpoint saved over tp 2
// (each rank 1 of the 2 kv heads, its q heads, its rows of gate/up) and pp 2
// (the untied lm_head on the last stage) must be the folder's weights exactly.
TEST(HfLlama, TrainGptStartsFromTheFoldersWeightsOverTpAndPp) {
  Scratch s("");
  const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / "llama-gqa2").string());
  const std::string mpi = "timeout -k 5 120 env LOOM_COLLECTIVE_TIMEOUT=60 " LOOM_MPIEXEC
                          " --allow-run-as-root --oversubscribe -np 2 ";
  for (const std::string flags : {"--tp 2", "--pp 2"}) {
    const fs::path ckpt = s.dir / "ckpt.safetensors";
    const test::Exec run = test::run_command(
        mpi + train_gpt() + " " + flags + " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --init-from " +
        (kRef / "llama-gqa2").string() + " --steps 1 --batch 2 --lr 1e-30 --warmup 0 --eval-every 0 --sample 0" +
        " --save " + ckpt.string() + " 2>&1");
    ASSERT_EQ(run.status, 0) << flags << "\n" << run.output;
    nn::SafetensorsFile saved = nn::load_safetensors(ckpt.string());
    for (const auto& [param, t] : hf.state) {
      ASSERT_TRUE(saved.contains(param)) << flags << ": " << param;
      EXPECT_EQ(saved.at(param).to_vector<float>(), t.to_vector<float>()) << flags << ": " << param;
    }
  }
}

TEST(HfLlama, RefusesConfigOptionsLoomCannotHonourNamingTheKeyAndValue) {
  const std::pair<std::string, std::string> edits[] = {
      {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}"},
      {"\"attention_bias\": false", "\"attention_bias\": true"},
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""},
      {"\"hidden_size\": 32", "\"head_dim\": 16, \"hidden_size\": 32"},
      {"\"hidden_size\": 32", "\"mlp_bias\": true, \"hidden_size\": 32"},
      {"\"LlamaForCausalLM\"", "\"LlamaForSequenceClassification\""}};
  const std::string want[] = {
      "\"rope_scaling\": {\"type\":\"linear\",\"factor\":2.0}: rope_type \"linear\" is not loom's Llama, which has "
      "\"default\"",
      "\"attention_bias\": true is not loom's Llama",
      "\"hidden_act\": \"gelu\" is not loom's Llama, which has silu",
      "\"head_dim\": 16 is not loom's Llama, which has hidden_size / num_attention_heads = 32 / 4",
      "\"mlp_bias\": true is not loom's Llama",
      "\"architectures\": [\"LlamaForSequenceClassification\"] is not loom's Llama"};
  for (size_t i = 0; i < std::size(edits); ++i) {
    Scratch s("llama-mqa");
    edit_config(s.model() / "config.json", edits[i].first, edits[i].second);
    const std::string e = error_loading(s.model());
    EXPECT_NE(e.find((s.model() / "config.json").string() + ": " + want[i]), std::string::npos) << e;
  }
}

TEST(HfLlama, RefusesAShapeAMissingTensorAndAMissingShardNamingTheFileAndTensor) {
  {  // 1 kv head in the config, 2 in the file: k_proj is [16, 32], the config makes it [8, 32]
    Scratch s("llama-gqa2");
    edit_config(s.model() / "config.json", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 1");
    const std::string e = error_loading(s.model());
    EXPECT_NE(e.find((s.model() / "model.safetensors").string() +
                     ": tensor 'model.layers.0.self_attn.k_proj.weight' is [16, 32], but"), std::string::npos) << e;
    EXPECT_NE(e.find("makes it [8, 32]"), std::string::npos) << e;
  }
  {  // an untied config over a tied file: lm_head.weight is missing
    Scratch s("llama-mqa");
    edit_config(s.model() / "config.json", "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false");
    const std::string e = error_loading(s.model());
    EXPECT_NE(e.find((s.model() / "model.safetensors").string() +
                     ": tensor 'lm_head.weight' is missing (loom's lm_head.weight, [41, 32])"), std::string::npos) << e;
  }
  {  // a tied config over an untied file: lm_head.weight is not wte
    Scratch s("llama-gqa2");
    edit_config(s.model() / "config.json", "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    const std::string e = error_loading(s.model());
    EXPECT_NE(e.find(": lm_head.weight differs from model.embed_tokens.weight; "), std::string::npos) << e;
  }
  {  // a v_proj taken out of the file
    Scratch s("llama-mqa");
    const std::string file = (s.model() / "model.safetensors").string();
    nn::SafetensorsFile f = nn::load_safetensors(file);
    nn::NamedTensors kept;
    for (auto& [name, t] : f.tensors)
      if (name != "model.layers.1.self_attn.v_proj.weight") kept.emplace_back(name, t);
    nn::save_safetensors(file, kept, f.metadata);
    const std::string e = error_loading(s.model());
    EXPECT_NE(e.find(file + ": tensor 'model.layers.1.self_attn.v_proj.weight' is missing (loom's "
                            "blocks.1.attn.c_attn.weight, [48, 32])"), std::string::npos) << e;
  }
  {  // a shard taken away
    Scratch s("llama-gqa2-sharded");
    const std::string second = test::shards_of(s.model()).at(1);
    fs::remove(s.model() / second);
    const std::string e = error_loading(s.model());
    EXPECT_NE(e.find("model.safetensors.index.json lists the shard " + second), std::string::npos) << e;
    EXPECT_NE(e.find("which is missing"), std::string::npos) << e;
  }
}

// Before any training: an architecture flag beside --init-from (the folder's
// config.json sets the model), and an export no transformers class reads.
TEST(HfLlama, TrainGptRefusesArchitectureFlagsBesideInitFromAndAnUnreadableExport) {
  const std::string data = " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --steps 1 --sample 0";
  const test::Exec run = test::run_command(train_gpt() + data + " --init-from " + (kRef / "llama-gqa2").string() +
                                           " --kv-heads 4 2>&1");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--kv-heads excludes --init-from"), std::string::npos) << run.output;
  Scratch s("");
  const test::Exec untied = test::run_command(train_gpt() + data + " --untied --export-hf " +
                                              (s.dir / "out").string() + " 2>&1");
  EXPECT_NE(untied.status, 0);
  EXPECT_NE(untied.output.find("--export-hf with --arch gpt2 --untied: transformers' GPT2LMHeadModel ties its head"),
            std::string::npos) << untied.output;
  EXPECT_EQ(untied.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << untied.output;
  // GPT-2 with grouped-query attention trained, then could not be exported (found by the combination sweep).
  const test::Exec gqa = test::run_command(train_gpt() + data + " --heads 4 --kv-heads 2 --export-hf " +
                                           (s.dir / "out").string() + " 2>&1");
  EXPECT_NE(gqa.status, 0);
  EXPECT_NE(gqa.output.find("--export-hf with --arch gpt2 --kv-heads 2 (of --heads 4): transformers' "
                            "GPT2LMHeadModel has one key/value head per query head"),
            std::string::npos) << gqa.output;
  EXPECT_EQ(gqa.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << gqa.output;
}
