// Running train_gpt from a test and comparing runs: the helpers of
// test_train_gpt_parallel.cpp (every parallel mode against one process) and
// test_teach_break.cpp (each --teach-break bug and its symptom).
//
// Every parallel mode of train_gpt against the single-process run on the same
// global batch: per-step losses and final parameters within 1e-5 relative.
//
// Why not bit-exact: the single process sums a batch's gradient inside one
// GEMM, while data parallel sums per-rank partial gradients with an
// all-reduce, and gradient accumulation adds micro-batch gradients one after
// another. Float addition is not associative, so the last bits differ; the
// differences stay at the 1e-7 level over 10 AdamW steps.
//
// Final parameters are compared per tensor, ||a - b|| / ||b|| (measured,
// fp32: <= 3.9e-6, most modes ~5e-7), with one exception. AdamW amplifies rounding noise wherever a
// gradient is near zero: its step is ~lr * m / sqrt(v), about lr in size
// whatever the gradient's magnitude, so an element whose true gradient is
// ~1e-9 moves by ~lr in a direction the rounding may flip. Such elements are
// a few per tensor (the worst single element of a tensor is ~3e-5 of that
// tensor's max), hence the norm rather than the max. The exception is the
// attention key bias (the middle third of each attn.c_attn.bias), where it
// is every element: softmax is invariant to adding the same number to every
// score of a query, so d loss / d b_k is exactly 0 in exact arithmetic and
// only rounding noise (~1e-10) reaches it. b_k then differs between runs by
// ~1e-6 absolute while its own scale is ~1e-2: it is compared as max |a - b|
// over the model's max |param| (measured <= 3.1e-6). The query and value
// thirds of the same bias are compared like every other tensor.
//
// Each run is `timeout 120 mpiexec -np N train_gpt ...` (CMake's
// MPIEXEC_EXECUTABLE) with the collective watchdog at 60 s: a deadlock ends
// with the watchdog's diagnosis of where each rank is stuck, and the timeout
// still fails the test if something else hangs. The work directory is removed
// when the test process ends (set LOOM_KEEP_WORK_DIRS=1 to keep it).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "nn/safetensors.h"
#include "run_command.h"
#include "tensor/ops.h"

namespace loom::test {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string output;
  std::vector<double> losses;
  std::vector<double> grad_norms;  // before clipping, as logged
  std::vector<int> steps;          // the "step" of each JSON line
  std::vector<std::string> log;    // the JSON lines
  nn::SafetensorsFile weights;
};

// One directory per test process (CTest runs these tests in parallel),
// removed when the process ends.
inline fs::path work_dir() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("loom_train_gpt_parallel_" + std::to_string(getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    std::ofstream f(p / "corpus.txt");
    for (int i = 0; i < 300; ++i) f << "The quick brown fox " << i << " jumps over the lazy dog.\n";
    return p;
  }();
  return d;
}

class RemoveWorkDir : public ::testing::Environment {
 public:
  void TearDown() override {
    fs::path d = fs::temp_directory_path() / ("loom_train_gpt_parallel_" + std::to_string(getpid()));
    if (!std::getenv("LOOM_KEEP_WORK_DIRS")) fs::remove_all(d);
  }
};
inline ::testing::Environment* const kRemoveWorkDir = ::testing::AddGlobalTestEnvironment(new RemoveWorkDir);

// The number after `"key": ` in a JSON line (inf and nan as printed by %g).
inline double field(const std::string& line, const std::string& key) {
  auto k = line.find("\"" + key + "\": ");
  EXPECT_NE(k, std::string::npos) << key << " in " << line;
  return k == std::string::npos ? std::nan("") : std::stod(line.substr(k + key.size() + 4));
}

inline std::string checkpoint(const std::string& name) { return (work_dir() / (name + ".safetensors")).string(); }

// Runs train_gpt on `ranks` processes (plain launch for 1) with the common small
// config; its --save is the Result's weights (save = false: no --save, no weights).
inline Result train(const std::string& name, int ranks, const std::string& args, bool save = true) {
  fs::path d = work_dir();
  std::string common = " --steps 10 --block 16 --layers 2 --heads 2 --embd 32 --eval-every 0 --sample 0 --warmup 3"
                       " --data " + (d / "corpus.txt").string() + " --log " + (d / (name + ".jsonl")).string() +
                       (save ? " --save " + checkpoint(name) : std::string()) + " ";
  // LOOM_TEST_LAUNCHER, when set, replaces mpiexec and its flags (tests/multihost: mpirun on several hosts).
  const char* launcher = std::getenv("LOOM_TEST_LAUNCHER");
  std::string launch = ranks == 1 ? std::string()
                                  : (launcher ? std::string(launcher)
                                              : std::string(LOOM_MPIEXEC) + " --allow-run-as-root --oversubscribe") +
                                        " -np " + std::to_string(ranks) + " ";
  // The watchdog (default 300 s) below the 120 s timeout, unless the caller chose one.
  std::string cmd = "timeout -k 5 120 env LOOM_COLLECTIVE_TIMEOUT=${LOOM_COLLECTIVE_TIMEOUT:-60} " + launch +
                    LOOM_TRAIN_GPT + common + args + " 2>&1";
  Result r;
  Exec run = run_command(cmd);
  r.status = run.status;
  r.output = std::move(run.output);
  if (r.status != 0) return r;
  std::ifstream log(d / (name + ".jsonl"));
  std::string line;
  while (std::getline(log, line)) {
    r.losses.push_back(field(line, "loss"));
    r.grad_norms.push_back(field(line, "grad_norm"));
    r.steps.push_back(int(field(line, "step")));
    r.log.push_back(line);
  }
  if (save) r.weights = nn::load_safetensors(checkpoint(name));
  return r;
}

// As train(), without --save: the run's --export-hf folder's model.safetensors
// (Hugging Face names) is the Result's weights.
inline Result train_and_export(const std::string& name, int ranks, const std::string& args) {
  const fs::path out = work_dir() / (name + "_hf");
  Result r = train(name, ranks, args + " --export-hf " + out.string(), /*save=*/false);
  if (r.status == 0) r.weights = nn::load_safetensors((out / "model.safetensors").string());
  return r;
}

// How far a is from b: max |a - b| and max |b|, ||a - b|| and ||b||.
struct Diff {
  double max_abs = 0, max_ref = 0, l2_diff = 0, l2_ref = 0;
};
inline Diff diff_of(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  Diff d;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    d.max_abs = std::max(d.max_abs, std::abs(x[i] - y[i]));
    d.max_ref = std::max(d.max_ref, std::abs(y[i]));
    d.l2_diff += (x[i] - y[i]) * (x[i] - y[i]);
    d.l2_ref += y[i] * y[i];
  }
  d.l2_diff = std::sqrt(d.l2_diff), d.l2_ref = std::sqrt(d.l2_ref);
  return d;
}

// tol: per-step loss and grad_norm, relative; param_tol: final params (see the top).
inline void expect_same_run(const Result& got, const Result& ref, const char* what, double tol = 1e-5,
                     double param_tol = 1e-5, double norm_tol = 1e-5) {
  ASSERT_EQ(got.status, 0) << what << "\n" << got.output;
  ASSERT_EQ(ref.status, 0) << "reference\n" << ref.output;
  // Both logs hold every step, once, in order.
  const std::vector<int> all_steps = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_EQ(got.steps, all_steps) << what;
  ASSERT_EQ(ref.steps, all_steps) << "reference";
  // Losses, and the gradient norm before clipping: AdamW (and clipping) hide a
  // constant factor on the gradient, so a dp that sums instead of averaging
  // shows in the logged grad_norm (2x at dp 2) long before in the loss.
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    double rel = std::abs(got.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]);
    EXPECT_LE(rel, tol) << what << ": step " << i << " loss " << got.losses[i] << " vs " << ref.losses[i];
    worst = std::max(worst, rel);
    const double g = got.grad_norms[i], g_ref = ref.grad_norms[i];
    if (g_ref == 0) {  // an fp16 step skipped on overflow logs 0: both must have skipped it
      EXPECT_EQ(g, 0) << what << ": step " << i << " grad_norm";
      continue;
    }
    double rel_norm = std::abs(g - g_ref) / std::abs(g_ref);
    EXPECT_LE(rel_norm, norm_tol) << what << ": step " << i << " grad_norm " << g << " vs " << g_ref;
    worst_norm = std::max(worst_norm, rel_norm);
  }
  ASSERT_EQ(got.weights.tensors.size(), ref.weights.tensors.size());
  // Pieces compared on their own scale: every tensor, the c_attn biases as q, k, v thirds.
  struct Piece {
    std::string name;
    Diff diff;
    bool key_bias;  // compared against the model's scale
  };
  std::vector<Piece> pieces;
  double model_scale = 0;
  for (const auto& [name, t] : ref.weights.tensors) {
    Tensor a = ops::reshape(ops::to(got.weights.at(name), kFloat32), {-1});
    Tensor b = ops::reshape(ops::to(t, kFloat32), {-1});
    const bool qkv_bias = name.ends_with("attn.c_attn.bias");
    const int parts = qkv_bias ? 3 : 1;
    for (int k = 0; k < parts; ++k) {
      const int64_t n = b.numel() / parts;
      Diff d = diff_of(ops::narrow(a, 0, k * n, n), ops::narrow(b, 0, k * n, n));
      pieces.push_back({qkv_bias ? name + (k == 0 ? " (q)" : k == 1 ? " (k)" : " (v)") : name, d, qkv_bias && k == 1});
      model_scale = std::max(model_scale, d.max_ref);
    }
  }
  double worst_param = 0, worst_key_bias = 0;
  std::string worst_name;
  for (const Piece& p : pieces) {
    const double rel = p.key_bias ? p.diff.max_abs / model_scale : p.diff.l2_diff / std::max(p.diff.l2_ref, 1e-30);
    EXPECT_LE(rel, param_tol) << what << ": final " << p.name
                              << (p.key_bias ? ", max |diff| / the model's max |param|" : ", ||diff|| / ||param||");
    if (p.key_bias) worst_key_bias = std::max(worst_key_bias, rel);
    else if (rel > worst_param) worst_param = rel, worst_name = p.name;
  }
  std::printf("[ measured ] %s: worst loss rel. error %.2e, grad_norm %.2e, params %.2e (%s), key bias %.2e\n", what,
              worst, worst_norm, worst_param, worst_name.c_str(), worst_key_bias);
}

// The tied embedding after a pipelined run: the first stage's wte and the last
// stage's copy in its LM head, as each stage saved its optimizer state (fp32
// main param, exp_avg, exp_avg_sq), must be bit-identical - the shared-weight
// handler sums their gradients, so they take the same steps.
inline void expect_tied_copies_identical(const std::string& name) {
  nn::SafetensorsFile index = nn::load_safetensors((work_dir() / (name + ".optim.safetensors")).string());
  std::map<std::string, std::vector<Tensor>> copies;  // fragment -> one per shard file that holds it
  std::stringstream list(index.metadata.at("shards"));
  for (std::string file; std::getline(list, file, ',');)
    for (auto& [key, t] : nn::load_safetensors((work_dir() / file).string()).tensors)
      if (key.find("/wte.weight/") != std::string::npos) copies[key].push_back(t);
  ASSERT_EQ(copies.count("main/wte.weight/0"), 1u) << name;
  for (const char* key : {"main/wte.weight/0", "exp_avg/wte.weight/0", "exp_avg_sq/wte.weight/0"}) {
    const std::vector<Tensor>& c = copies[key];
    ASSERT_EQ(c.size(), 2u) << name << ": " << key << " saved by the first and the last stage";
    EXPECT_EQ(c[0].to_vector<float>(), c[1].to_vector<float>()) << name << ": " << key;
  }
}

// got and ref (the same run but for one flag: ref_name) logged the same
// losses and gradient norms and saved the same weights, bit for bit.
inline void expect_bit_identical(const Result& got, const Result& ref, const std::string& what,
                                 const std::string& ref_name) {
  ASSERT_EQ(ref.status, 0) << what << " (" << ref_name << ")\n" << ref.output;
  ASSERT_EQ(got.status, 0) << what << "\n" << got.output;
  ASSERT_EQ(ref.losses.size(), 10u) << what;
  EXPECT_EQ(got.losses, ref.losses) << what;
  EXPECT_EQ(got.grad_norms, ref.grad_norms) << what;
  ASSERT_EQ(got.weights.tensors.size(), ref.weights.tensors.size()) << what;
  for (const auto& [name, t] : ref.weights.tensors) {
    const Tensor& g = got.weights.at(name);
    ASSERT_EQ(g.dtype(), t.dtype()) << what << ": " << name;
    EXPECT_EQ(g.to_vector<double>(), t.to_vector<double>()) << what << ": final " << name;
  }
}

inline const Result& single_process_batch16() {
  static Result r = train("single_b16", 1, "--batch 16");
  return r;
}

}  // namespace loom::test
