// What the Hugging Face tests (test_hf_checkpoint, test_hf_llama) share: the
// reference a tests/hf/make_*.py fixture saved (ids, targets, transformers'
// logits and loss), scratch copies of its folders to damage, and the losses
// tests/hf/hf_loss.py prints for the folders from_pretrained reads.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/safetensors.h"
#include "tensor/ops.h"

namespace loom::test {

namespace fs = std::filesystem;

struct HfReference {
  Tensor ids, targets, logits;  // [2, 16] int64, [2, 16] int64, [2, 16, V] fp32
  double loss;
};

inline HfReference hf_reference(const fs::path& file) {
  nn::SafetensorsFile f = nn::load_safetensors(file.string());
  return {f.at("input_ids"), f.at("targets"), f.at("logits"), f.at("loss").to_vector<double>()[0]};
}

// loom's GPT with a state dict in loom's names, in eval mode (dropout is 0 anyway).
inline std::shared_ptr<nn::GPT> gpt_with(const nn::GPTConfig& cfg, const nn::NamedTensors& state) {
  auto model = std::make_shared<nn::GPT>(cfg);
  model->load_state_dict(state);
  model->train(false);
  return model;
}

inline double loss_of(nn::GPT& model, const HfReference& ref) {
  return nn::cross_entropy_loss(model.forward(ref.ids), ref.targets).item<double>();
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_vector<float>()) m = std::max(m, double(std::abs(v)));
  return m;
}

inline void expect_same_tensors(const nn::NamedTensors& a, const nn::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>()) << a[i].first;
  }
}

// A scratch folder (with a copy of the reference folder ref_dir/from as
// model/, when from is not empty), removed at the end of the test.
struct Scratch {
  fs::path dir;
  Scratch(const fs::path& ref_dir, const std::string& from) {
    dir = fs::temp_directory_path() / ("loom_hf_" + std::to_string(getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    if (!from.empty()) fs::copy(ref_dir / from, dir / "model", fs::copy_options::recursive);
  }
  ~Scratch() { fs::remove_all(dir); }
  fs::path model() const { return dir / "model"; }
};

// The shard files of a sharded folder, in order: model-00001-of-0000M.safetensors, ...
inline std::vector<std::string> shards_of(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (std::regex_match(e.path().filename().string(), std::regex("model-[0-9]{5}-of-[0-9]{5}\\.safetensors")))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Replaces the first `from` in the file by `to` (a test's damaged config.json).
inline void edit_config(const fs::path& config, const std::string& from, const std::string& to) {
  std::ifstream in(config);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " not in " << config;
  text.replace(at, from.size(), to);
  std::ofstream(config) << text;
}

// hf_loss.py's lines {"folder": "DIR", "loss": x}: folder -> transformers' loss.
inline std::map<std::string, double> hf_losses(const std::string& output) {
  const std::regex line("\\{\"folder\": \"([^\"]+)\", \"loss\": ([-0-9.e]+)\\}");
  std::map<std::string, double> losses;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it)
    losses[(*it)[1]] = std::stod((*it)[2]);
  return losses;
}

}  // namespace loom::test
