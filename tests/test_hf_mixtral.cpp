// Hugging Face Mixtral folders against transformers 4.40 itself (nn/hf_mixtral.h).
// tests/hf/make_mixtral.py (the hf_mixtral_reference fixture) saved two random
// MixtralForCausalLM - mixtral-top2 (4 experts, 2 per token, 2 kv heads,
// untied; also sharded) and mixtral-top1 (3 experts, 1 per token, 1 kv head,
// tied) - and the logits and loss each gives on fixed ids. loom loads them and
// must give the same numbers: that checks the expert name table, w1/w3/w2's
// roles, the router's softmax, top-k and renormalisation. Then train_gpt trains
// from them (and a Mixtral of its own), exports, and from_pretrained must give
// loom's loss. Bad folders fail naming the key and the value.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "error_of.h"
#include "hf_folder.h"
#include "nn/arch_metadata.h"
#include "nn/hf_checkpoint.h"
#include "nn/hf_config.h"
#include "nn/safetensors.h"
#include "run_command.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

const fs::path kRef = LOOM_HF_REFERENCE_DIR;  // make_mixtral.py's output
const std::string kPython = LOOM_HF_PYTHON;   // the venv's python

test::HfReference reference(const std::string& model) {
  return test::hf_reference(kRef / (model + ".reference.safetensors"));
}

struct Scratch : test::Scratch {
  explicit Scratch(const std::string& from) : test::Scratch(kRef, from) {}
};

std::string train_gpt() { return test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT); }

const std::string kData = " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt";

}  // namespace

TEST(HfMixtral, LoadsTransformersMixtralWithTheSameLogitsAndLoss) {
  struct Want {
    std::string model;
    int64_t experts, per_token, kv_heads;
    double rope_base, norm_eps;
    bool tied;
  };
  for (const Want& w : {Want{"mixtral-top2", 4, 2, 2, 1e6, 1e-5, false}, Want{"mixtral-top1", 3, 1, 1, 1e4, 1e-6, true}}) {
    SCOPED_TRACE(w.model);
    const test::HfReference ref = reference(w.model);
    const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / w.model).string());
    EXPECT_EQ(nn::hf_family(hf.cfg), "mixtral");
    EXPECT_EQ(hf.cfg.moe.experts, w.experts);
    EXPECT_EQ(hf.cfg.moe.experts_per_token, w.per_token);
    EXPECT_EQ(hf.cfg.kv_heads(), w.kv_heads);
    EXPECT_EQ(hf.cfg.ffn_hidden(), 48);
    EXPECT_EQ(hf.cfg.rope_base, w.rope_base);
    EXPECT_EQ(hf.cfg.norm_eps, w.norm_eps);
    EXPECT_EQ(hf.cfg.tied_embeddings, w.tied);
    // wte, 2 x (ln_1, c_attn, c_proj, ln_2, gate, 3 E expert matrices), ln_f (+ lm_head when untied).
    EXPECT_EQ(hf.state.size(), size_t(2 + 2 * (5 + 3 * w.experts) + (w.tied ? 0 : 1)));
    auto model = test::gpt_with(hf.cfg, hf.state);
    const Tensor logits = model->forward(ref.ids);
    ASSERT_EQ(logits.shape(), ref.logits.shape());
    const double err = test::max_abs(ops::sub(logits, ref.logits)), scale = test::max_abs(ref.logits);
    EXPECT_LE(err, 1e-5 * scale) << "max |loom - transformers| " << err << ", max |logit| " << scale;
    std::printf("%s: max |loom - transformers 4.40| %.3g, max |logit| %.3g\n", w.model.c_str(), err, scale);
    EXPECT_NEAR(nn::cross_entropy_loss(logits, ref.targets).item<double>(), ref.loss, 1e-5 * ref.loss);
  }
}

TEST(HfMixtral, ShardedFolderHoldsTheSameModelAndSaveLoadsBack) {
  ASSERT_GE(test::shards_of(kRef / "mixtral-top2-sharded").size(), 2u) << "save_pretrained did not shard";
  const nn::HfCheckpoint whole = nn::load_hf_checkpoint((kRef / "mixtral-top2").string());
  test::expect_same_tensors(nn::load_hf_checkpoint((kRef / "mixtral-top2-sharded").string()).state, whole.state);
  Scratch s("");
  for (const std::string model : {"mixtral-top2", "mixtral-top1"}) {
    const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / model).string());
    nn::save_hf_checkpoint((s.dir / model).string(), hf.cfg, hf.state, 40000);
    EXPECT_GE(test::shards_of(s.dir / model).size(), 2u);
    const nn::HfCheckpoint back = nn::load_hf_checkpoint((s.dir / model).string());
    test::expect_same_tensors(back.state, hf.state);
    EXPECT_EQ(nn::arch_metadata(back.cfg), nn::arch_metadata(hf.cfg)) << model;
    EXPECT_EQ(back.cfg.moe.experts, hf.cfg.moe.experts);
  }
}

// train_gpt --init-from each folder (mixtral-top2 with the aux loss and a
// capacity, so that training drops tokens), 3 AdamW steps, --save and a sharded
// --export-hf; and a Mixtral loom made (--arch llama --experts 4). transformers'
// loss of each export must be loom's loss of the model it saved.
TEST(HfMixtral, TransformersReadsWhatTrainGptTrainedAndExported) {
  Scratch s("");
  const test::HfReference ref = reference("mixtral-top2");  // both references hold the same ids and targets
  struct Run {
    std::string name, flags;
  };
  const Run runs[] = {
      {"mixtral-top2", "--init-from " + (kRef / "mixtral-top2").string() +
                           " --router-aux-loss-coef 0.02 --capacity-factor 1.0"},
      {"mixtral-top1", "--init-from " + (kRef / "mixtral-top1").string()},
      // No --router-bias-update-rate: Mixtral routes without a bias, so its export is refused.
      {"loom-made", "--arch llama --experts 4 --experts-per-token 2 --layers 2 --heads 4 --kv-heads 2 --embd 32 "
                    "--mlp-hidden 24 --block 16"}};
  std::map<std::string, double> loom_loss;
  std::string folders;
  for (const Run& r : runs) {
    SCOPED_TRACE(r.name);
    const fs::path out = s.dir / (r.name + "-exported"), ckpt = s.dir / (r.name + ".safetensors");
    const test::Exec run = test::run_command(train_gpt() + kData + " " + r.flags +
                                             " --steps 3 --batch 4 --lr 1e-2 --warmup 0 --eval-every 0 --sample 0"
                                             " --save " + ckpt.string() + " --export-hf " + out.string() +
                                             " --export-hf-shard-mb 0.04 2>&1");
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("(Hugging Face Mixtral"), std::string::npos) << run.output;
    ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json")) << run.output;
    const nn::HfCheckpoint exported = nn::load_hf_checkpoint(out.string());
    EXPECT_EQ(exported.cfg.moe.experts, r.name == "mixtral-top1" ? 3 : 4);
    auto trained = test::gpt_with(exported.cfg, nn::load_safetensors(ckpt.string()).tensors);
    loom_loss[out.string()] = test::loss_of(*trained, ref);
    if (r.name != "loom-made") {
      EXPECT_GT(std::abs(loom_loss[out.string()] - reference(r.name).loss), 1e-3) << "3 steps changed nothing";
    }
    folders += " " + out.string();
  }
  const test::Exec py = test::run_command(kPython + " " LOOM_TEST_DATA_DIR "/hf/hf_loss.py " +
                                          (kRef / "mixtral-top2.reference.safetensors").string() + folders + " 2>&1");
  ASSERT_EQ(py.status, 0) << py.output;
  const std::map<std::string, double> hf_loss = test::hf_losses(py.output);
  ASSERT_EQ(hf_loss.size(), 3u) << py.output;
  for (const auto& [folder, loss] : loom_loss) {
    ASSERT_TRUE(hf_loss.contains(folder)) << folder << "\n" << py.output;
    EXPECT_NEAR(hf_loss.at(folder), loss, 1e-5 * loss) << folder << ": transformers " << hf_loss.at(folder)
                                                       << ", loom " << loss;
  }
}

TEST(HfMixtral, RefusesConfigOptionsLoomCannotHonourNamingTheKeyAndValue) {
  const std::pair<std::string, std::string> edits[] = {
      {"\"router_jitter_noise\": 0.0", "\"router_jitter_noise\": 0.1"},
      {"\"sliding_window\": null", "\"sliding_window\": 8"},
      {"\"num_experts_per_tok\": 1", "\"num_experts_per_tok\": 4"},
      {"\"MixtralForCausalLM\"", "\"LlamaForCausalLM\""}};
  const std::string want[] = {
      "\"router_jitter_noise\": 0.1 is not loom's Mixtral, which has 0",
      "\"sliding_window\": 8 is not loom's Mixtral, which has null",
      "\"num_experts_per_tok\": 4 must be in [1, num_local_experts = 3]",
      "\"architectures\": [\"LlamaForCausalLM\"] is not loom's Llama, which has MixtralForCausalLM"};
  for (size_t i = 0; i < std::size(edits); ++i) {
    Scratch s("mixtral-top1");
    test::edit_config(s.model() / "config.json", edits[i].first, edits[i].second);
    const std::string e = test::error_of([&] { nn::load_hf_checkpoint(s.model().string()); });
    EXPECT_NE(e.find((s.model() / "config.json").string() + ": " + want[i]), std::string::npos) << e;
  }
  {  // a config of 4 experts over a file of 3: expert 3's tensors are missing
    Scratch s("mixtral-top1");
    test::edit_config(s.model() / "config.json", "\"num_local_experts\": 3", "\"num_local_experts\": 4");
    const std::string e = test::error_of([&] { nn::load_hf_checkpoint(s.model().string()); });
    EXPECT_NE(e.find("tensor 'model.layers.0.block_sparse_moe.gate.weight' is [3, 32], but"), std::string::npos) << e;
  }
}

// Before any training: expert flags beside --init-from (the folder's config.json
// sets them), and an export of shared experts, which MixtralForCausalLM lacks.
TEST(HfMixtral, TrainGptRefusesExpertFlagsBesideInitFromAndSharedExpertsExport) {
  const test::Exec run = test::run_command(train_gpt() + kData + " --steps 1 --sample 0 --init-from " +
                                           (kRef / "mixtral-top1").string() + " --experts 3 2>&1");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--experts excludes --init-from"), std::string::npos) << run.output;
  Scratch s("");
  const test::Exec shared = test::run_command(train_gpt() + kData + " --steps 1 --sample 0 --arch llama --experts 4 "
                                              "--shared-experts 1 --export-hf " + (s.dir / "out").string() + " 2>&1");
  EXPECT_NE(shared.status, 0);
  EXPECT_NE(shared.output.find("--export-hf with --shared-experts 1: transformers' MixtralForCausalLM has no shared "
                               "experts"), std::string::npos) << shared.output;
  EXPECT_EQ(shared.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << shared.output;
}
