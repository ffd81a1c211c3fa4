// The main job end to end: train_gpt runs, logs, checkpoints, resumes bit-exactly,
// and fails cleanly on bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "nn/safetensors.h"

namespace fs = std::filesystem;

namespace {

struct Exec {
  int status;
  std::string output;
};

Exec run(const std::string& args) {
  std::string cmd = std::string(LOOM_TRAIN_GPT) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Work directories, removed when the test process ends (LOOM_KEEP_WORK_DIRS=1 keeps them).
std::vector<fs::path>& work_dirs() {
  static std::vector<fs::path> dirs;
  return dirs;
}

class RemoveWorkDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    if (std::getenv("LOOM_KEEP_WORK_DIRS")) return;
    for (const fs::path& d : work_dirs()) fs::remove_all(d);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveWorkDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveWorkDirs);

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("loom_train_gpt_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  work_dirs().push_back(d);
  return d;
}

// The "loss" field of every JSON line, as the exact text printed (%.17g: round-trips a double).
std::vector<std::string> losses(const fs::path& log) {
  std::ifstream in(log);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    auto k = line.find("\"loss\": ");
    if (k == std::string::npos) continue;
    auto e = line.find(',', k);
    out.push_back(line.substr(k + 8, e - k - 8));
  }
  return out;
}

// A small corpus so the test does not depend on the fortunes package.
fs::path corpus(const fs::path& dir) {
  fs::path p = dir / "corpus.txt";
  std::ofstream f(p);
  for (int i = 0; i < 200; ++i) f << "The quick brown fox " << i << " jumps over the lazy dog.\n";
  return p;
}

const std::string kSmall = " --batch 4 --block 16 --layers 2 --heads 2 --embd 32 --eval-every 0 --sample 0 --warmup 3 ";

}  // namespace

// For every --dtype: the fp32 main params, the AdamW state and (fp16) the loss
// scaler are in the checkpoint. fp16 runs with a short growth window and an
// overflow at step 4, so the scale changes before and after the save: a
// resume that lost the scaler's state would diverge.
class TrainGptResume : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainGptResume, IsBitExact) {
  const std::string dtype = GetParam();
  fs::path d = temp_dir("resume_" + dtype);
  std::string data = " --data " + corpus(d).string() + " --dtype " + dtype;
  if (dtype == "fp16") data += " --loss-scale-window 3 --inject-overflow 4";
  Exec straight = run("--steps 20" + kSmall + data + " --log " + (d / "straight.jsonl").string());
  ASSERT_EQ(straight.status, 0) << straight.output;
  Exec first = run("--steps 20 --stop-at 10" + kSmall + data + " --save " + (d / "ck.safetensors").string() +
                  " --log " + (d / "first.jsonl").string());
  ASSERT_EQ(first.status, 0) << first.output;
  // The first run stopped after 10 of 20 steps; resume runs the other 10.
  Exec half = run("--steps 20" + kSmall + data + " --resume " + (d / "ck.safetensors").string() + " --log " +
                 (d / "resumed.jsonl").string());
  ASSERT_EQ(half.status, 0) << half.output;

  std::vector<std::string> a = losses(d / "straight.jsonl"), r = losses(d / "resumed.jsonl");
  ASSERT_EQ(a.size(), 20u);
  std::vector<std::string> f = losses(d / "first.jsonl");
  ASSERT_EQ(f.size(), 10u);
  ASSERT_EQ(r.size(), 10u);  // steps 10..19 only
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(f[i], a[i]) << "step " << i;
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(r[i], a[10 + i]) << "step " << 10 + i;
  if (dtype == "fp16") {  // the scale did move: 2^16, x2 after 3 clean steps, halved by the overflow at step 4
    std::ifstream in(d / "straight.jsonl");
    std::string line;
    std::vector<std::string> lines;
    while (std::getline(in, line)) lines.push_back(line);
    EXPECT_NE(lines[2].find("\"loss_scale\": 65536"), std::string::npos) << lines[2];
    EXPECT_NE(lines[3].find("\"loss_scale\": 131072"), std::string::npos) << lines[3];
    EXPECT_NE(lines[4].find("\"skipped\": true"), std::string::npos) << lines[4];
    EXPECT_NE(lines[5].find("\"loss_scale\": 65536"), std::string::npos) << lines[5];
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TrainGptResume, ::testing::Values("fp32", "bf16", "fp16"));

// Also: a flag given twice takes its last value (examples/train.sh passes its
// own --steps, and `bash examples/train.sh --steps 50` overrides it).
TEST(TrainGpt, WritesOneJsonLinePerStepAndCheckpointFiles) {
  fs::path d = temp_dir("log");
  Exec r = run("--steps 9 --steps 5 --eval-every 5" +
              std::string(" --batch 2 --block 8 --layers 1 --heads 1 --embd 8 --sample 20 ") +
              "--data " + corpus(d).string() + " --save " + (d / "m.safetensors").string() + " --log " +
              (d / "log.jsonl").string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(d / "log.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    for (const char* key : {"\"step\": ", "\"loss\": ", "\"lr\": ", "\"tokens_per_s\": ", "\"ms\": "})
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    EXPECT_EQ(line.find("val_loss") != std::string::npos, n == 4) << line;
    ++n;
  }
  EXPECT_EQ(n, 5);
  EXPECT_TRUE(fs::exists(d / "m.safetensors"));
  EXPECT_TRUE(fs::exists(d / "m.optim.safetensors"));
  EXPECT_FALSE(fs::exists(d / "m.safetensors.tmp"));
  EXPECT_NE(r.output.find("---- sample"), std::string::npos);
}

TEST(TrainGpt, LossDecreasesOnAFixedCorpus) {
  fs::path d = temp_dir("learn");
  Exec r = run("--steps 60 --lr 1e-2" + kSmall + "--data " + corpus(d).string() + " --log " + (d / "l.jsonl").string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<std::string> l = losses(d / "l.jsonl");
  ASSERT_EQ(l.size(), 60u);
  // Starts near ln(vocab) (uniform guess) and must fall well below it.
  EXPECT_LT(std::stod(l.back()), 0.6 * std::stod(l.front()));
}

TEST(TrainGpt, BadInputFailsWithAClearMessage) {
  fs::path d = temp_dir("bad");
  Exec missing = run("--steps 1 --data /nonexistent/x.txt");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.output.find("'/nonexistent/x.txt' does not exist"), std::string::npos) << missing.output;

  std::ofstream(d / "short.txt") << "tiny";
  Exec short_corpus = run("--steps 1 --block 16 --data " + (d / "short.txt").string());
  EXPECT_EQ(short_corpus.status, 1);
  EXPECT_NE(short_corpus.output.find("shorter than block_size + 1 = 17"), std::string::npos) << short_corpus.output;

  std::ofstream(d / "trunc.safetensors") << "12345";
  Exec bad_ckpt = run("--steps 1" + kSmall + "--data " + corpus(d).string() + " --resume " + (d / "trunc.safetensors").string());
  EXPECT_EQ(bad_ckpt.status, 1);
  EXPECT_NE(bad_ckpt.output.find("trunc.safetensors"), std::string::npos) << bad_ckpt.output;

  // A sharded checkpoint whose shard file is gone: the error names the index and the param.
  Exec saved = run("--steps 2" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --save " +
                   (d / "ck.safetensors").string());
  ASSERT_EQ(saved.status, 0) << saved.output;
  fs::remove(d / "ck.optim.0.safetensors");
  Exec no_shard = run("--steps 3" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --resume " +
                      (d / "ck.safetensors").string());
  EXPECT_EQ(no_shard.status, 1);
  EXPECT_NE(no_shard.output.find("ck.optim.0.safetensors"), std::string::npos) << no_shard.output;

  // A shard without AdamW's step counts: an error, not a silent restart of the bias correction.
  Exec saved2 = run("--steps 2" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --save " +
                    (d / "ck2.safetensors").string());
  ASSERT_EQ(saved2.status, 0) << saved2.output;
  const std::string shard = (d / "ck2.optim.0.safetensors").string();
  loom::nn::SafetensorsFile f = loom::nn::load_safetensors(shard);
  loom::nn::NamedTensors kept;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind("step/", 0) != 0) kept.emplace_back(name, t);
  ASSERT_LT(kept.size(), f.tensors.size());
  loom::nn::save_safetensors(shard, kept, f.metadata);
  Exec no_step = run("--steps 3" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --resume " +
                     (d / "ck2.safetensors").string());
  EXPECT_EQ(no_step.status, 1);
  EXPECT_NE(no_step.output.find("AdamW's step count"), std::string::npos) << no_step.output;
  EXPECT_NE(no_step.output.find("ck2.optim.0.safetensors"), std::string::npos) << no_step.output;

  Exec negative_mbs = run("--steps 1 --microbatches -2" + kSmall + "--data " + corpus(d).string());
  EXPECT_NE(negative_mbs.status, 0);
  EXPECT_NE(negative_mbs.output.find("--microbatches"), std::string::npos) << negative_mbs.output;

  Exec naive_zero = run("--steps 1 --zero --dp-mode naive" + kSmall + "--data " + corpus(d).string());
  EXPECT_EQ(naive_zero.status, 1);
  EXPECT_NE(naive_zero.output.find("needs --dp-mode bucket"), std::string::npos) << naive_zero.output;

  Exec bad_heads = run("--steps 1 --embd 30 --heads 4" + std::string(" --data ") + corpus(d).string());
  EXPECT_EQ(bad_heads.status, 1);
  EXPECT_NE(bad_heads.output.find("n_embd 30 is not divisible by n_head 4"), std::string::npos) << bad_heads.output;
}
