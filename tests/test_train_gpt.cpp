// The main job end to end: train_gpt runs, logs, checkpoints, resumes bit-exactly,
// and fails cleanly on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/data.h"
#include "nn/gpt.h"
#include "nn/hf_checkpoint.h"
#include "nn/safetensors.h"
#include "optim/checkpoint_manifest.h"
#include "optim/checkpoint_manifest_check.h"
#include "run_command.h"
#include "tensor/cuda/cuda.h"
#include "tensor/ops.h"

namespace fs = std::filesystem;

namespace {

using loom::test::Exec;
using loom::test::run_command;

Exec run(const std::string& args) { return run_command(std::string(LOOM_TRAIN_GPT) + " " + args + " 2>&1"); }

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
  // The pid keeps two suites running at once (two checkouts, one machine) out of each other's files.
  fs::path d = fs::temp_directory_path() / ("loom_train_gpt_" + name + "_" + std::to_string(getpid()));
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

// Rewrites a checkpoint's manifest so that it lists its pieces as they now are
// on disk, and reseals it: how a test gets an edited piece past the checksums
// to the check behind them.
void recommit(const fs::path& model_path) {
  fs::path index = model_path;
  index.replace_extension(".optim.safetensors");
  loom::nn::SafetensorsFile m = loom::nn::load_safetensors(index.string());
  std::vector<loom::optim::CheckpointPiece> pieces = loom::optim::decode_pieces(m.metadata.at("pieces"), m.path);
  for (auto& p : pieces) p = loom::optim::describe_piece((model_path.parent_path() / p.file).string());
  m.metadata["pieces"] = loom::optim::encode_pieces(pieces);
  loom::optim::write_manifest(index.string(), m.tensors, m.metadata);  // under a fresh checksum of its own
}

const std::string kSmall = " --batch 4 --block 16 --layers 2 --heads 2 --embd 32 --eval-every 0 --sample 0 --warmup 3 ";

}  // namespace

// For every --dtype: the fp32 main params, the AdamW state and (fp16) the loss
// scaler are in the checkpoint. fp16 runs with a short growth window and an
// overflow at step 4, so the scale changes before and after the save: a
// resume that lost the scaler's state would diverge. With --dropout the
// layers' Philox offset is in the checkpoint too: a resume that restarted it
// would draw the first steps' masks again.
class TrainGptResume : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainGptResume, IsBitExact) {
  const std::string flags = GetParam();  // "<dtype>[ more flags]"
  const std::string dtype = flags.substr(0, flags.find(' '));
  fs::path d = temp_dir("resume_" + dtype + (flags == dtype ? "" : "_more"));
  std::string data = " --data " + corpus(d).string() + " --dtype " + flags;
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

INSTANTIATE_TEST_SUITE_P(Dtypes, TrainGptResume, ::testing::Values("fp32", "bf16", "fp16", "fp32 --dropout 0.2"));

// Dropout's masks are a function of (seed, offset, element) alone, so the
// math threads may split them any way: 1 and 2 threads give the same losses
// bit for bit (and the dropout is on: they differ from --dropout 0's).
TEST(TrainGpt, DropoutRunsAreTheSameOnOneAndTwoThreads) {
  fs::path d = temp_dir("dropout_threads");
  const std::string data = " --steps 6" + kSmall + "--data " + corpus(d).string() + " ";
  for (const char* t : {"1", "2"}) {
    Exec r = run(data + "--dropout 0.2 --threads " + t + " --log " + (d / (std::string("t") + t + ".jsonl")).string());
    ASSERT_EQ(r.status, 0) << r.output;
  }
  Exec plain = run(data + "--log " + (d / "plain.jsonl").string());
  ASSERT_EQ(plain.status, 0) << plain.output;
  std::vector<std::string> one = losses(d / "t1.jsonl"), two = losses(d / "t2.jsonl");
  ASSERT_EQ(one.size(), 6u);
  EXPECT_EQ(one, two);
  EXPECT_NE(one, losses(d / "plain.jsonl"));
}

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
    for (const char* key : {"\"step\": ", "\"loss\": ", "\"lr\": ", "\"tokens_per_s\": ", "\"ms\": ",
                            "\"live_mib\": ", "\"peak_mib\": "})
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    // The allocator's view (bench/plot_run.py draws it): the model is live, and the peak is at least that.
    const size_t live_at = line.find("\"live_mib\": "), peak_at = line.find("\"peak_mib\": ");
    if (live_at != std::string::npos && peak_at != std::string::npos) {
      const double live = std::stod(line.substr(live_at + 12)), peak = std::stod(line.substr(peak_at + 12));
      EXPECT_GT(live, 0.0) << line;
      EXPECT_GE(peak, live) << line;
    }
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

// --eod-mask-loss names one token that occurs in the text; anything else is
// refused before training, naming the text.
TEST(TrainGpt, AnEodMaskThatIsNotOneTokenOfTheTextIsRefused) {
  fs::path d = temp_dir("eod");
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"ab", "--eod-mask-loss 'ab' is 2 characters, not one token"},
           {"#", "--eod-mask-loss '#': a character of it is not in --data"}}) {
    Exec r = run("--steps 2" + kSmall + "--data " + corpus(d).string() + " --eod-mask-loss '" + text + "'");
    EXPECT_EQ(r.status, 1) << text;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step "), std::string::npos) << "trained before refusing: " << text;
  }
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
  EXPECT_NE(short_corpus.output.find("--data " + (d / "short.txt").string() + ": "), std::string::npos)
      << short_corpus.output;

  std::ofstream(d / "trunc.safetensors") << "12345";
  Exec bad_ckpt = run("--steps 1" + kSmall + "--data " + corpus(d).string() + " --resume " + (d / "trunc.safetensors").string());
  EXPECT_EQ(bad_ckpt.status, 1);
  EXPECT_NE(bad_ckpt.output.find("trunc.safetensors"), std::string::npos) << bad_ckpt.output;

  // A sharded checkpoint whose shard file is gone: the error names the piece and the manifest.
  Exec saved = run("--steps 2" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --save " +
                   (d / "ck.safetensors").string());
  ASSERT_EQ(saved.status, 0) << saved.output;
  fs::remove(d / "ck.step2.optim.0.safetensors");
  Exec no_shard = run("--steps 3" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --resume " +
                      (d / "ck.safetensors").string());
  EXPECT_EQ(no_shard.status, 1);
  EXPECT_NE(no_shard.output.find("ck.step2.optim.0.safetensors' listed in the manifest"), std::string::npos)
      << no_shard.output;

  // A shard without AdamW's step counts: an error, not a silent restart of the bias correction.
  Exec saved2 = run("--steps 2" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --save " +
                    (d / "ck2.safetensors").string());
  ASSERT_EQ(saved2.status, 0) << saved2.output;
  const std::string shard = (d / "ck2.step2.optim.0.safetensors").string();
  loom::nn::SafetensorsFile f = loom::nn::load_safetensors(shard);
  loom::nn::NamedTensors kept;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind("step/", 0) != 0) kept.emplace_back(name, t);
  ASSERT_LT(kept.size(), f.tensors.size());
  loom::nn::save_safetensors(shard, kept, f.metadata);
  recommit(d / "ck2.safetensors");  // past the manifest's checksum, to reach the shard's own check
  Exec no_step = run("--steps 3" + kSmall + "--dtype bf16 --data " + corpus(d).string() + " --resume " +
                     (d / "ck2.safetensors").string());
  EXPECT_EQ(no_step.status, 1);
  EXPECT_NE(no_step.output.find("AdamW's step count"), std::string::npos) << no_step.output;
  EXPECT_NE(no_step.output.find("ck2.step2.optim.0.safetensors"), std::string::npos) << no_step.output;

  Exec negative_mbs = run("--steps 1 --microbatches -2" + kSmall + "--data " + corpus(d).string());
  EXPECT_NE(negative_mbs.status, 0);
  EXPECT_NE(negative_mbs.output.find("--microbatches"), std::string::npos) << negative_mbs.output;

  Exec naive_zero = run("--steps 1 --zero --dp-mode naive" + kSmall + "--data " + corpus(d).string());
  EXPECT_EQ(naive_zero.status, 1);
  EXPECT_NE(naive_zero.output.find("needs --dp-mode bucket"), std::string::npos) << naive_zero.output;

  Exec bad_heads = run("--steps 1 --embd 30 --heads 4" + std::string(" --data ") + corpus(d).string());
  EXPECT_EQ(bad_heads.status, 1);
  EXPECT_NE(bad_heads.output.find("--embd 30 must be divisible by --heads 4"), std::string::npos) << bad_heads.output;
}

// Every flag is checked before any work (no "data:" line yet), with loom's
// message naming the flag, the value and the allowed range, and exit 1 - not a
// SIGFPE at step 10 (--log-every 0), a sample that fails after training
// (--temperature 0), or a bad path found only when the checkpoint is written.
TEST(TrainGpt, EveryFlagIsCheckedBeforeTrainingWithItsRange) {
  fs::path d = temp_dir("flags");
  std::ofstream(d / "file") << "x";
  const std::string data = " --steps 2" + kSmall + "--data " + corpus(d).string() + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--log-every 0", "--log-every must be an integer in [1, 1099511627776], got '0'"},
      {"--top-k -3", "--top-k must be an integer in [0, 1048576] (0: all), got '-3'"},
      {"--eval-every -1", "--eval-every must be an integer in [0, 1099511627776] (0: never), got '-1'"},
      {"--temperature 0", "--temperature must be a number in (0, 1000000], got '0'"},
      {"--eval-batches 0", "--eval-batches must be an integer in [1, 1048576], got '0'"},
      {"--steps 0", "--steps must be an integer in [1, 1099511627776], got '0'"},
      {"--lr nan", "--lr must be a number in (0, 1e+30], got 'nan'"},
      {"--dropout 1", "--dropout must be a number in [0, 0.99], got '1'"},
      {"--bucket-mb 0", "--bucket-mb must be a number in (0, 1000000] (1e6 MiB: 977 GiB), got '0'"},
      {"--loss-scale-backoff 2", "--loss-scale-backoff must be a number in [1e-06, 1], got '2'"},
      {"--loss-scale 0.5", "--loss-scale must be a number in [1, 1e+30] (fp16's scaler stops below 1), got '0.5'"},
      // 1e20 does not fit int64: refused as written (CLI11 read the largest int64).
      {"--layers 99999999999999999999", "--layers must be an integer in [1, 4096], got '99999999999999999999'"},
      {"--layers 4 --embd 1000000",
       "--embd 1000000 --block 16: about 4.8e+07 M parameters need 768000 GB for weights, gradients and AdamW state"},
      {"--embd 30 --heads 4", "--embd 30 must be divisible by --heads 4"},
      {"--save " + d.string(), "--save '" + d.string() + "' is a directory; give a file path"},
      {"--save " + d.string() + "/", "is a directory; give a file path"},
      {"--log " + (d / "no" / "log.jsonl").string(), "--log '" + (d / "no" / "log.jsonl").string() + "': '" +
                                                        (d / "no").string() + "' does not exist"},
      {"--trace " + (d / "file" / "t.json").string(), "': '" + (d / "file").string() + "' is not a directory"},
      {"--save " + (d / "file" / "ck.safetensors").string(), "'" + (d / "file").string() + "' is not a directory"},
  };
  for (const auto& [flags, message] : cases) {
    Exec r = run(data + flags);
    EXPECT_EQ(r.status, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("data:"), std::string::npos) << flags << ": work began before the check\n" << r.output;
  }
  // --save creates missing directories, so a path under one that does not exist yet is fine.
  Exec nested = run(data + "--save " + (d / "new" / "dir" / "ck.safetensors").string());
  EXPECT_EQ(nested.status, 0) << nested.output;
  EXPECT_TRUE(fs::exists(d / "new" / "dir" / "ck.safetensors"));
}

// --device is checked before any work: a bad name, --tf32 without a GPU
// device, --tp on a GPU, --backend nccl on the CPU, and - on a machine or
// build without CUDA, as here - cuda itself, with the runtime's reason (which
// 16-bit, --zero, --dp and --pp on either backend now reach). tests/cuda/test_cuda_train_gpt.cpp runs
// it on a GPU.
TEST(TrainGpt, DeviceIsCheckedUpFront) {
  fs::path d = temp_dir("device");
  const std::string data = " --steps 2" + kSmall + "--data " + corpus(d).string() + " ";
  std::vector<std::pair<std::string, std::string>> cases = {
      {"--device gpu", "--device gpu: device: cannot parse 'gpu' (expected cpu, cuda or cuda:N)"},
      {"--device cuda:x", "--device cuda:x: device: cannot parse 'cuda:x'"},
      {"--tf32", "--tf32 selects the GPU's GEMM precision; it needs --device cuda"},
      {"--device cuda:0 --tp 2 --heads 2", "--device cuda:0 with --tp 2: the tensor-parallel layers make host buffers"},
      {"--backend nccl", "--backend nccl exchanges GPU tensors; it needs --device cuda"},
      {"--cuda-kernels fast", "--cuda-kernels chooses the GPU's kernels; it needs --device cuda"},
  };
  if (!loom::built_with_cuda())
    cases.push_back({"--device cuda:0", "--device cuda:0: loom was built without CUDA (configure with -DLOOM_CUDA=ON)"});
  else if (loom::cuda::device_count() == 0)
    for (const char* flags : {"--device cuda:0", "--device cuda:0 --dtype bf16 --zero", "--device cuda:0 --dtype fp16",
                              "--device cuda:0 --dp 2 --backend mpi", "--device cuda:0 --dp 2",
                              "--device cuda:0 --pp 2", "--device cuda:0 --dp 2 --pp 2 --backend mpi"})
      cases.push_back({flags, "--device cuda:0: no CUDA device (cudaGetDeviceCount"});  // 16-bit, --zero, dp allowed
  else  // a GPU machine: an index past the last one
    cases.push_back({"--device cuda:99", "--device cuda:99: this machine has "});
  for (const auto& [flags, message] : cases) {
    Exec r = run(data + flags);
    EXPECT_EQ(r.status, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(r.output.find("data:"), std::string::npos) << flags << ": work began before the check\n" << r.output;
  }
  if (loom::built_with_cuda()) {  // a bad LOOM_CUDA_KERNELS (tensor/cuda/kernel_choice.h), before any work
    Exec r = run_command("LOOM_CUDA_KERNELS=quick " + std::string(LOOM_TRAIN_GPT) + " " + data + "--device cuda:0 2>&1");
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("LOOM_CUDA_KERNELS=quick: expected fast or reference"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("data:"), std::string::npos) << "work began before the check\n" << r.output;
  }
  // --device cpu is today's run: the same losses as no --device at all.
  Exec plain = run(data + "--log " + (d / "plain.jsonl").string());
  Exec cpu = run(data + "--device cpu --log " + (d / "cpu.jsonl").string());
  ASSERT_EQ(plain.status, 0) << plain.output;
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  EXPECT_EQ(losses(d / "plain.jsonl"), losses(d / "cpu.jsonl"));
}

// The sample's prompt is a newline only when the corpus has one; otherwise its
// first character, so a one-line corpus still trains and samples.
TEST(TrainGpt, SamplesFromACorpusWithoutANewline) {
  fs::path d = temp_dir("no_newline");
  {
    std::ofstream f(d / "line.txt");
    for (int i = 0; i < 100; ++i) f << "one line without an end " << i << ". ";
  }
  Exec r = run("--steps 2" + kSmall + "--sample 30 --data " + (d / "line.txt").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("---- sample (30 characters");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n----\n", at), std::string::npos) << r.output;
}

// A run that diverges stops at the step where the loss or the grad norm stops
// being finite, exit 1, naming the step; the checkpoint it saved before keeps
// finite weights, and the log's last line writes the NaN as JSON null.
TEST(TrainGpt, DivergenceStopsTheRunBeforeItReachesACheckpoint) {
  fs::path d = temp_dir("diverge");
  Exec r = run("--steps 20 --lr 1e30 --warmup 0 --save-every 1" + kSmall + "--data " + corpus(d).string() +
               " --save " + (d / "ck.safetensors").string() + " --log " + (d / "log.jsonl").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("the training diverged"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("stopping without saving"), std::string::npos) << r.output;
  // Every saved weight is finite.
  loom::nn::SafetensorsFile saved = loom::nn::load_safetensors((d / "ck.safetensors").string());
  for (const auto& [name, t] : saved.tensors)
    for (float x : loom::ops::to(t, loom::kFloat32).to_vector<float>()) ASSERT_TRUE(std::isfinite(x)) << name;
  // The log: one line per step run, the last with null where the number was not finite.
  std::ifstream in(d / "log.jsonl");
  std::string line, last;
  while (std::getline(in, line)) {
    EXPECT_EQ(line.find("nan"), std::string::npos) << line;
    EXPECT_EQ(line.find("inf"), std::string::npos) << line;
    last = line;
  }
  EXPECT_NE(last.find("null"), std::string::npos) << last;
}

// fp16 whose every step overflows (an exploding lr) does not skip forever: the
// loss scale reaches its floor and the run stops, saying so.
TEST(TrainGpt, Fp16ThatOverflowsAtEveryScaleStops) {
  fs::path d = temp_dir("fp16_floor");
  Exec r = run("--steps 200 --lr 1e30 --warmup 0 --dtype fp16" + kSmall + "--data " + corpus(d).string());
  EXPECT_EQ(r.status, 1) << r.output;
  // Step 1's update (lr 1e30) makes the fp16 weights inf: every later step
  // overflows and is skipped: 16 halvings take 2^16 to the floor of 1, the 17th would pass it.
  EXPECT_NE(r.output.find("loss scaling: the gradients overflowed in 17 steps in a row"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("below its floor (1 x 0.5 < min_scale 1)"), std::string::npos) << r.output;
}

// --steps below the checkpoint's step would run nothing and label the state wrongly.
TEST(TrainGpt, StepsBelowTheCheckpointsStepIsAnError) {
  fs::path d = temp_dir("steps_below");
  ASSERT_EQ(run("--steps 5" + kSmall + "--data " + corpus(d).string() + " --save " + (d / "ck.safetensors").string())
                .status,
            0);
  Exec r = run("--steps 3" + kSmall + "--data " + corpus(d).string() + " --resume " + (d / "ck.safetensors").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--steps 3 is below the step of the checkpoint"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(5 steps done)"), std::string::npos) << r.output;
}

// Resuming on a corpus with a character the checkpoint's vocabulary lacks names both.
TEST(TrainGpt, ACorpusOutsideTheCheckpointsVocabularyIsNamed) {
  fs::path d = temp_dir("vocab");
  ASSERT_EQ(run("--steps 2" + kSmall + "--data " + corpus(d).string() + " --save " + (d / "ck.safetensors").string())
                .status,
            0);
  std::ofstream(d / "other.txt") << std::string(400, 'Z') << "\n" << corpus(d).string();
  Exec r = run("--steps 3" + kSmall + "--data " + (d / "other.txt").string() + " --resume " +
               (d / "ck.safetensors").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("--data " + (d / "other.txt").string() + " does not fit the vocabulary of the checkpoint"),
            std::string::npos)
      << r.output;
}

// Under mpirun a rank's stdout is a pty Open MPI forwards, so isatty() says yes
// even when mpirun's output goes to a pipe or file: progress must still come
// as whole lines, with no \r rewriting one line in place.
TEST(TrainGpt, UnderMpirunProgressComesAsWholeLines) {
  fs::path d = temp_dir("mpirun_lines");
  Exec r = run_command(std::string(LOOM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 1 " + LOOM_TRAIN_GPT +
                       " --steps 3" + kSmall + "--data " + corpus(d).string() + " 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("step     3/3"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "a \\r in the output of a run under mpirun";
}

// --save creates the directories it needs, relative or absolute, as README's
// main command (`--save out/gpt.safetensors` on a fresh checkout) relies on.
TEST(TrainGpt, SaveCreatesMissingDirectories) {
  fs::path d = temp_dir("save_dirs");
  Exec relative = run_command("cd " + d.string() + " && " + LOOM_TRAIN_GPT + " --steps 1" + kSmall + "--data " +
                              corpus(d).string() + " --save out/gpt.safetensors 2>&1");
  ASSERT_EQ(relative.status, 0) << relative.output;
  EXPECT_TRUE(fs::exists(d / "out" / "gpt.safetensors"));
  Exec absolute = run("--steps 1" + kSmall + "--data " + corpus(d).string() + " --save " +
                      (d / "a" / "b" / "gpt.safetensors").string());
  ASSERT_EQ(absolute.status, 0) << absolute.output;
  EXPECT_TRUE(fs::exists(d / "a" / "b" / "gpt.safetensors"));
}

// --init-from DIR without --tokenizer trains on DIR/tokenizer.json's ids when
// the folder has one (a folder train_gpt --export-hf wrote after a --tokenizer
// run, or a hub model's), and says so: the first loss is the one --tokenizer
// DIR/tokenizer.json gives, and the export carries the tokenizer on. The
// tokenizer is made here (GPT-2's 256 byte characters and one merge, "h e").
TEST(TrainGpt, InitFromTrainsOnTheFoldersTokenizerJsonAndSaysSo) {
  const fs::path d = temp_dir("init_from_tokenizer");
  nlohmann::ordered_json vocab, tok;
  for (int b = 0, extra = 0; b < 256; ++b) {  // GPT-2's bytes_to_unicode: printable bytes stand for themselves
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    vocab[loom::data::encode_utf8(std::u32string(1, char32_t(printable ? b : 256 + extra++)))] = b;
  }
  vocab["he"] = 256;
  tok["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e"}}};
  tok["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  std::ofstream(d / "tok.json") << tok.dump();
  const loom::nn::GPTConfig cfg{257, 16, 1, 2, 16, 0.0, 7};
  loom::nn::GPT start(cfg);
  loom::nn::save_hf_checkpoint((d / "model").string(), cfg, start.named_parameters(), 0, (d / "tok.json").string());
  const fs::path own = d / "model" / "tokenizer.json";
  const std::string common = "--steps 2 --batch 2 --eval-every 0 --sample 0 --data " + corpus(d).string() +
                             " --init-from " + (d / "model").string();
  Exec implicit = run(common + " --log " + (d / "implicit.jsonl").string() + " --export-hf " + (d / "out").string());
  ASSERT_EQ(implicit.status, 0) << implicit.output;
  EXPECT_NE(implicit.output.find("tokenizer: " + own.string() + " (--init-from's own; --tokenizer FILE picks another)"),
            std::string::npos) << implicit.output;
  EXPECT_NE(implicit.output.find("vocab 257 (BPE " + own.string() + ")"), std::string::npos) << implicit.output;
  EXPECT_TRUE(fs::exists(d / "out" / "tokenizer.json"));
  Exec given = run(common + " --tokenizer " + (d / "tok.json").string() + " --log " + (d / "given.jsonl").string());
  ASSERT_EQ(given.status, 0) << given.output;
  EXPECT_EQ(given.output.find("tokenizer: "), std::string::npos) << given.output;
  EXPECT_NE(given.output.find("vocab 257 (BPE " + (d / "tok.json").string() + ")"), std::string::npos) << given.output;
  ASSERT_EQ(losses(d / "implicit.jsonl").size(), 2u);
  EXPECT_EQ(losses(d / "implicit.jsonl"), losses(d / "given.jsonl"));
}
