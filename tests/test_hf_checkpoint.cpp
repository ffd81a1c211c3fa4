// Hugging Face GPT-2 folders against transformers itself (nn/hf_checkpoint.h).
// tests/hf/make_gpt2.py (the hf_reference fixture, in the venv that
// tests/hf/setup_venv.sh installs) saved a random GPT2LMHeadModel with
// save_pretrained, once whole and once sharded, and the logits and loss it
// gives on fixed token ids. Here loom loads those folders and must give the
// same numbers; then train_gpt starts from the folder, trains, exports, and
// transformers' from_pretrained must give loom's loss. Bad folders fail with
// the file and tensor named.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <algorithm>

#include <nlohmann/json.hpp>

#include "data/bpe_tokenizer.h"
#include "data/data.h"
#include "error_of.h"
#include "hf_folder.h"
#include "nn/gpt.h"
#include "nn/hf_checkpoint.h"
#include "nn/loss.h"
#include "nn/safetensors.h"
#include "run_command.h"
#include "tensor/ops.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

const fs::path kRef = LOOM_HF_REFERENCE_DIR;  // make_gpt2.py's output
const std::string kPython = LOOM_HF_PYTHON;   // the venv's python

using Reference = test::HfReference;
using test::edit_config;
using test::error_of;
using test::expect_same_tensors;
using test::gpt_with;
using test::loss_of;
using test::max_abs;
using test::shards_of;

Reference reference() { return test::hf_reference(kRef / "reference.safetensors"); }

// A scratch copy of one of the reference folders, removed at the end of the test.
struct Scratch : test::Scratch {
  explicit Scratch(const std::string& from) : test::Scratch(kRef, from) {}
};

}  // namespace

TEST(HfCheckpoint, LoadsTransformersGpt2WithTheSameLogitsAndLoss) {
  const Reference ref = reference();
  const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / "gpt2").string());
  EXPECT_EQ(hf.cfg.n_layer, 2);
  EXPECT_EQ(hf.cfg.n_embd, 32);
  EXPECT_EQ(hf.cfg.block_size, 16);
  EXPECT_EQ(hf.cfg.vocab_size, ref.logits.size(2));
  auto model = gpt_with(hf.cfg, hf.state);
  const Tensor logits = model->forward(ref.ids);
  ASSERT_EQ(logits.shape(), ref.logits.shape());
  // 1e-5 of the logits' scale, element by element (measured: ~1e-7).
  const double err = max_abs(ops::sub(logits, ref.logits)), scale = max_abs(ref.logits);
  EXPECT_LE(err, 1e-5 * scale) << "max |loom - transformers| " << err << ", max |logit| " << scale;
  const double loss = nn::cross_entropy_loss(logits, ref.targets).item<double>();
  EXPECT_NEAR(loss, ref.loss, 1e-5 * ref.loss);
}

TEST(HfCheckpoint, ShardedFolderHoldsTheSameModel) {
  ASSERT_TRUE(fs::exists(kRef / "gpt2-sharded" / "model.safetensors.index.json"));
  ASSERT_GE(shards_of(kRef / "gpt2-sharded").size(), 2u) << "save_pretrained(max_shard_size=20kB) did not shard";
  const nn::HfCheckpoint whole = nn::load_hf_checkpoint((kRef / "gpt2").string());
  const nn::HfCheckpoint sharded = nn::load_hf_checkpoint((kRef / "gpt2-sharded").string());
  expect_same_tensors(sharded.state, whole.state);
}

TEST(HfCheckpoint, SaveThenLoadGivesTheSameTensorsWholeAndSharded) {
  Scratch s("");
  const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / "gpt2").string());
  nn::save_hf_checkpoint((s.dir / "whole").string(), hf.cfg, hf.state);
  nn::save_hf_checkpoint((s.dir / "sharded").string(), hf.cfg, hf.state, 20000);
  EXPECT_TRUE(fs::exists(s.dir / "whole" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(s.dir / "sharded" / "model.safetensors.index.json"));
  // 112 kB of tensors in shards of at most 20 kB (one tensor, 16 kB c_fc, per shard mostly).
  const std::vector<std::string> shards = shards_of(s.dir / "sharded");
  EXPECT_GE(shards.size(), 6u);
  for (const std::string& f : shards) EXPECT_LE(fs::file_size(s.dir / "sharded" / f), 20000u + 4096u) << f;
  EXPECT_FALSE(fs::exists(s.dir / "whole.tmp"));
  expect_same_tensors(nn::load_hf_checkpoint((s.dir / "whole").string()).state, hf.state);
  expect_same_tensors(nn::load_hf_checkpoint((s.dir / "sharded").string()).state, hf.state);
  // A second save replaces the first folder whole: no stale shard left beside the new file.
  nn::save_hf_checkpoint((s.dir / "sharded").string(), hf.cfg, hf.state);
  EXPECT_FALSE(fs::exists(s.dir / "sharded" / "model.safetensors.index.json"));
  expect_same_tensors(nn::load_hf_checkpoint((s.dir / "sharded").string()).state, hf.state);
}

TEST(HfCheckpoint, RefusesAnUnknownArchitectureNamingTheFile) {
  Scratch s("gpt2");
  edit_config(s.model() / "config.json", "\"model_type\": \"gpt2\"", "\"model_type\": \"bert\"");
  const std::string e = error_of([&] { nn::load_hf_checkpoint(s.model().string()); });
  EXPECT_NE(e.find((s.model() / "config.json").string()), std::string::npos) << e;
  EXPECT_NE(e.find("model_type \"bert\" is not an architecture loom reads"), std::string::npos) << e;
  Scratch t("gpt2");
  edit_config(t.model() / "config.json", "\"GPT2LMHeadModel\"", "\"GPT2ForSequenceClassification\"");
  const std::string e2 = error_of([&] { nn::load_hf_checkpoint(t.model().string()); });
  EXPECT_NE(e2.find("\"architectures\": [\"GPT2ForSequenceClassification\"] is not loom's GPT-2"), std::string::npos)
      << e2;
}

TEST(HfCheckpoint, RefusesATensorWhoseShapeIsNotTheConfigs) {
  Scratch s("gpt2");
  edit_config(s.model() / "config.json", "\"n_positions\": 16", "\"n_positions\": 32");
  const std::string e = error_of([&] { nn::load_hf_checkpoint(s.model().string()); });
  EXPECT_NE(e.find((s.model() / "model.safetensors").string() + ": tensor 'transformer.wpe.weight' is [16, 32], but"),
            std::string::npos) << e;
  EXPECT_NE(e.find("makes it [32, 32]"), std::string::npos) << e;
}

TEST(HfCheckpoint, RefusesAMissingShardNamingTheIndexAndTheShard) {
  Scratch s("gpt2-sharded");
  const std::string second = shards_of(s.model()).at(1);
  fs::remove(s.model() / second);
  const std::string e = error_of([&] { nn::load_hf_checkpoint(s.model().string()); });
  EXPECT_NE(e.find("model.safetensors.index.json lists the shard " + second), std::string::npos) << e;
  EXPECT_NE(e.find("which is missing"), std::string::npos) << e;
}

TEST(HfCheckpoint, RefusesAMissingTensorNamingTheFileAndTheTensor) {
  Scratch s("gpt2");
  const std::string file = (s.model() / "model.safetensors").string();
  nn::SafetensorsFile f = nn::load_safetensors(file);
  nn::NamedTensors kept;
  for (auto& [name, t] : f.tensors)
    if (name != "transformer.h.1.mlp.c_fc.weight") kept.emplace_back(name, t);
  nn::save_safetensors(file, kept, f.metadata);
  const std::string e = error_of([&] { nn::load_hf_checkpoint(s.model().string()); });
  EXPECT_NE(e.find(file + ": tensor 'transformer.h.1.mlp.c_fc.weight' is missing (loom's blocks.1.mlp.c_fc.weight"),
            std::string::npos) << e;
}

// train_gpt --init-from the transformers folder, 3 AdamW steps, --save (loom's
// own checkpoint) and --export-hf (sharded); loom's loss of the saved model on
// the reference tokens must be transformers' loss of the exported folder.
TEST(HfCheckpoint, TransformersReadsWhatTrainGptTrainedAndExported) {
  Scratch s("");
  const Reference ref = reference();
  const std::string train_gpt = test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT);
  const fs::path out = s.dir / "exported", ckpt = s.dir / "ckpt.safetensors";
  const test::Exec run = test::run_command(
      train_gpt + " --data " + LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --init-from " + (kRef / "gpt2").string() +
      " --steps 3 --batch 4 --lr 1e-2 --warmup 0 --eval-every 0 --sample 0 --save " + ckpt.string() +
      " --export-hf " + out.string() + " --export-hf-shard-mb 0.02 2>&1");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("init: " + (kRef / "gpt2").string()), std::string::npos) << run.output;
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json")) << run.output;

  // loom's loss of what it trained, from its own checkpoint.
  const nn::HfCheckpoint start = nn::load_hf_checkpoint((kRef / "gpt2").string());
  nn::SafetensorsFile saved = nn::load_safetensors(ckpt.string());
  auto trained = gpt_with(start.cfg, saved.tensors);
  const double loom_loss = loss_of(*trained, ref);
  EXPECT_GT(std::abs(loom_loss - ref.loss), 1e-3) << "the 3 steps did not change the model";

  // transformers' loss of the export: the sharded folder, and a one-file copy loom writes of the same model
  // (one python run for both: importing torch and transformers is most of its time).
  nn::save_hf_checkpoint((s.dir / "whole").string(), start.cfg, saved.tensors);
  const test::Exec py = test::run_command(kPython + " " LOOM_TEST_DATA_DIR "/hf/hf_loss.py " +
                                          (kRef / "reference.safetensors").string() + " " + out.string() + " " +
                                          (s.dir / "whole").string() + " 2>&1");
  ASSERT_EQ(py.status, 0) << py.output;
  const std::regex line("\\{\"folder\": \"([^\"]+)\", \"loss\": ([-0-9.e]+)\\}");
  int folders = 0;
  for (auto it = std::sregex_iterator(py.output.begin(), py.output.end(), line); it != std::sregex_iterator(); ++it) {
    const double hf_loss = std::stod((*it)[2]);
    EXPECT_NEAR(hf_loss, loom_loss, 1e-5 * loom_loss) << (*it)[1] << ": transformers " << hf_loss << ", loom "
                                                      << loom_loss;
    ++folders;
  }
  EXPECT_EQ(folders, 2) << py.output;
}

TEST(HfCheckpoint, TrainGptRefusesModelFlagsBesideInitFromAndABadFolderBeforeTraining) {
  const std::string train_gpt = test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT);
  const std::string data = " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --steps 1 --sample 0";
  const test::Exec both = test::run_command(train_gpt + data + " --init-from " + (kRef / "gpt2").string() +
                                            " --layers 3 2>&1");
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("--layers excludes --init-from"), std::string::npos) << both.output;
  Scratch s("gpt2-sharded");
  const std::string third = shards_of(s.model()).at(2);
  fs::remove(s.model() / third);
  const test::Exec bad = test::run_command(train_gpt + data + " --init-from " + s.model().string() + " 2>&1");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("lists the shard " + third), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << bad.output;
  Scratch t("gpt2");
  edit_config(t.model() / "config.json", "\"model_type\": \"gpt2\"", "\"model_type\": \"mistral\"");
  const test::Exec mistral = test::run_command(train_gpt + data + " --init-from " + t.model().string() + " 2>&1");
  EXPECT_NE(mistral.status, 0);
  EXPECT_NE(mistral.output.find("model_type \"mistral\" is not an architecture loom reads "
                                "(it reads: gpt2, llama, mixtral)"),
            std::string::npos) << mistral.output;
  // A vocabulary larger than the corpus's characters: the end's sample could print nothing sensible.
  Scratch v("gpt2");
  edit_config(v.model() / "config.json", "\"vocab_size\": 41", "\"vocab_size\": 50");
  const test::Exec big = test::run_command(train_gpt + " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --steps 1"
                                           " --init-from " + v.model().string() + " 2>&1");
  EXPECT_NE(big.status, 0);
  EXPECT_NE(big.output.find("vocab_size 50 is more than the 41 characters"), std::string::npos) << big.output;
}

// --init-from on every grid: one step at lr 1e-30 changes no fp32 bit, so the
// checkpoint loom saves (the whole model, gathered) must be the folder's
// weights exactly - on one process, cut over tp 2 (load_full_state's
// cut_shard, the padded vocabulary) and split over pp 2 (the last stage's
// copy of the tied wte).
TEST(HfCheckpoint, TrainGptStartsFromTheFoldersWeightsOnEveryGrid) {
  Scratch s("");
  const nn::HfCheckpoint hf = nn::load_hf_checkpoint((kRef / "gpt2").string());
  const std::string train_gpt = test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT);
  const std::string mpi = "timeout -k 5 120 env LOOM_COLLECTIVE_TIMEOUT=60 " LOOM_MPIEXEC
                          " --allow-run-as-root --oversubscribe -np 2 ";
  const std::pair<std::string, std::string> grids[] = {{"one", ""}, {"tp2", "--tp 2"}, {"pp2", "--pp 2"}};
  for (const auto& [name, flags] : grids) {
    const fs::path ckpt = s.dir / (name + ".safetensors");
    const test::Exec run = test::run_command(
        (flags.empty() ? "" : mpi) + train_gpt + " " + flags + " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt" +
        " --init-from " + (kRef / "gpt2").string() + " --steps 1 --batch 2 --lr 1e-30 --warmup 0 --eval-every 0" +
        " --sample 0 --save " + ckpt.string() + " 2>&1");
    ASSERT_EQ(run.status, 0) << name << "\n" << run.output;
    const std::map<std::string, Tensor> saved = [&] {
      nn::SafetensorsFile f = nn::load_safetensors(ckpt.string());
      return std::map<std::string, Tensor>(f.tensors.begin(), f.tensors.end());
    }();
    for (const auto& [param, t] : hf.state) {
      ASSERT_TRUE(saved.contains(param)) << name << ": " << param;
      EXPECT_EQ(saved.at(param).to_vector<float>(), t.to_vector<float>()) << name << ": " << param;
    }
  }
}

// tests/hf/make_tokenizer.py trained a byte-level BPE on the corpus with the
// `tokenizers` package and encoded the corpus and a few strings that reach
// every branch of GPT-2's pattern: loom's ids must be its ids, token for
// token, and decoding must give the text back.
TEST(BpeTokenizer, EncodesLikeTheTokenizersPackageAndDecodesBack) {
  const data::BpeTokenizer tok = data::BpeTokenizer::from_file((kRef / "tokenizer.json").string());
  EXPECT_EQ(tok.vocab_size(), 300);
  std::ifstream in(kRef / "tokenizer_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["texts"].size(), 5u);
  for (size_t i = 0; i < ref["texts"].size(); ++i) {
    const std::string text = ref["texts"][i];
    const std::vector<int32_t> want = ref["ids"][i];
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, want) << "text " << i << ": " << text.substr(0, 80);
    EXPECT_EQ(tok.decode(ids), text) << "text " << i;
  }
  EXPECT_GT(ref["ids"][0].size(), 1000u);  // the corpus: 4013 bytes in fewer tokens than bytes, but many
  EXPECT_LT(ref["ids"][0].size(), 4013u);
}

TEST(BpeTokenizer, SplitsWordsWithGpt2sPattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(data::BpeTokenizer::pre_tokenize("Hello  world's\n\n x"),
            (V{"Hello", " ", " world", "'s", "\n\n", " x"}));
  EXPECT_EQ(data::BpeTokenizer::pre_tokenize("I'M 12ab ?! end  "), (V{"I", "'", "M", " 12", "ab", " ?!", " end", "  "}));
}

// train_gpt --tokenizer: the corpus is encoded with the BPE's ids. The test
// builds train_gpt's first batch itself from the ids `tokenizers` gave for the
// corpus (make_tokenizer.py) and loom's sampler (same seed), and transformers'
// GPT2LMHeadModel's loss on that batch must be the loss train_gpt logs at step
// 1 (before its update), starting from the same weights: a different id
// anywhere in the batch would change it.
TEST(BpeTokenizer, TrainGptTrainsOnTheTokenizersIdsAndTransformersGivesItsLoss) {
  Scratch s("");
  const fs::path tok = kRef / "tokenizer.json";
  std::ifstream in(kRef / "tokenizer_reference.json");
  const std::vector<int32_t> corpus_ids = nlohmann::json::parse(in)["ids"][0];
  // A random 2-layer GPT-2 over the tokenizer's 300 ids, as a Hugging Face folder.
  nn::GPTConfig cfg{300, 16, 2, 4, 32, 0.0, 7};
  nn::GPT start(cfg);
  nn::save_hf_checkpoint((s.dir / "start").string(), cfg, start.named_parameters());
  // train_gpt's first global batch: 4 rows from the training 90% of the ids, drawn by Generator(--seed).
  const data::TextDataset ds(corpus_ids, cfg.block_size);
  Generator data_gen(1337);
  const data::Batch batch = ds.sample("train", 4, data_gen);
  nn::save_safetensors((s.dir / "batch.safetensors").string(), {{"input_ids", batch.x}, {"targets", batch.y}});

  const fs::path log = s.dir / "log.jsonl", out = s.dir / "exported";
  const test::Exec run = test::run_command(
      test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT) + " --data " LOOM_TEST_DATA_DIR
      "/data/tiny_corpus.txt --tokenizer " + tok.string() + " --init-from " + (s.dir / "start").string() +
      " --steps 1 --batch 4 --lr 1e-30 --warmup 0 --eval-every 0 --sample 40 --seed 1337 --log " + log.string() +
      " --export-hf " + out.string() + " 2>&1");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("vocab 300 (BPE " + tok.string() + ")"), std::string::npos) << run.output;
  // The sample: 40 tokens of a random model, many of them lone bytes of a character, printed as UTF-8 text.
  const size_t sample = run.output.find("---- sample (40 tokens");
  ASSERT_NE(sample, std::string::npos) << run.output;
  EXPECT_NO_THROW(data::decode_utf8(run.output.substr(sample), "the sample")) << run.output.substr(sample);
  std::ifstream log_in(log);
  std::string first;
  std::getline(log_in, first);
  const double loom_loss = nlohmann::json::parse(first).at("loss").get<double>();
  // The export carries the tokenizer beside the model.
  std::ifstream a(tok, std::ios::binary), b(out / "tokenizer.json", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), std::string(std::istreambuf_iterator<char>(b), {}));

  const test::Exec py = test::run_command(kPython + " " LOOM_TEST_DATA_DIR "/hf/hf_loss.py " +
                                          (s.dir / "batch.safetensors").string() + " " + (s.dir / "start").string() +
                                          " 2>&1");
  ASSERT_EQ(py.status, 0) << py.output;
  const std::map<std::string, double> hf = test::hf_losses(py.output);
  ASSERT_EQ(hf.size(), 1u) << py.output;
  EXPECT_NEAR(loom_loss, hf.begin()->second, 1e-5 * loom_loss) << "train_gpt " << loom_loss << ", transformers "
                                                              << hf.begin()->second;
}

// A checkpoint records its tokenizer: resuming it without --tokenizer, or with
// another tokenizer.json (the same vocabulary, one byte more), is refused
// naming both; a model whose vocab_size is not the tokenizer's is refused
// before training.
TEST(BpeTokenizer, TrainGptRefusesAResumeWithAnotherTokenizerAndAModelOfAnotherVocabulary) {
  Scratch s("");
  const std::string train_gpt = test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT) +
                                " --data " LOOM_TEST_DATA_DIR "/data/tiny_corpus.txt --batch 2 --block 16 --layers 1"
                                " --embd 16 --heads 2 --eval-every 0 --sample 0";
  const fs::path tok = kRef / "tokenizer.json", other = s.dir / "other.json", ckpt = s.dir / "ckpt.safetensors";
  fs::copy_file(tok, other);
  std::ofstream(other, std::ios::app) << "\n";
  const test::Exec first = test::run_command(train_gpt + " --steps 1 --tokenizer " + tok.string() + " --save " +
                                             ckpt.string() + " 2>&1");
  ASSERT_EQ(first.status, 0) << first.output;
  const test::Exec same = test::run_command(train_gpt + " --steps 2 --tokenizer " + tok.string() + " --resume " +
                                            ckpt.string() + " 2>&1");
  EXPECT_EQ(same.status, 0) << same.output;
  const test::Exec none = test::run_command(train_gpt + " --steps 2 --resume " + ckpt.string() + " 2>&1");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("--resume " + ckpt.string() +
                             " was trained on the ids of a BPE tokenizer (tokenizer.json "),
            std::string::npos) << none.output;
  const test::Exec another = test::run_command(train_gpt + " --steps 2 --tokenizer " + other.string() + " --resume " +
                                               ckpt.string() + " 2>&1");
  EXPECT_NE(another.status, 0);
  EXPECT_NE(another.output.find("--tokenizer " + other.string() + " (tokenizer.json "), std::string::npos)
      << another.output;
  EXPECT_NE(another.output.find(") is not the tokenizer --resume " + ckpt.string() +
                                " was trained with (tokenizer.json "),
            std::string::npos) << another.output;
  const test::Exec vocab = test::run_command(
      test::program_path("LOOM_TRAIN_GPT", "train_gpt", LOOM_TRAIN_GPT) + " --data " LOOM_TEST_DATA_DIR
      "/data/tiny_corpus.txt --steps 1 --sample 0 --tokenizer " + tok.string() + " --init-from " +
      (kRef / "gpt2").string() + " 2>&1");
  EXPECT_NE(vocab.status, 0);
  EXPECT_NE(vocab.output.find("--tokenizer " + tok.string() + " has 300 tokens, but the model's vocab_size is 41"),
            std::string::npos) << vocab.output;
  EXPECT_EQ(vocab.output.find("| loss "), std::string::npos) << "trained before refusing:\n" << vocab.output;
}
