// train_gpt's checkpoints: two safetensors files, written to a temp file and
// renamed so an interrupted save never destroys the previous checkpoint.
//   PATH                    the model: every parameter by name; the config and
//                           the vocabulary in __metadata__ (loads in PyTorch)
//   PATH.optim.safetensors  the optimizer state (AdamW exp_avg, exp_avg_sq,
//                           step), the data generator's state, the step count
// Resuming from both continues the run bit for bit.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "nn/gpt.h"
#include "optim/optimizer.h"

namespace loom::train {

struct TrainState {
  int64_t step = 0;                  // steps completed
  std::array<uint64_t, 4> data_rng;  // Generator::state() of the batch sampler
};

std::string optimizer_path(const std::string& model_path);

void save_checkpoint(const std::string& path, const nn::GPT& model, const std::string& vocab_utf8,
                     const optim::Optimizer& opt, const TrainState& state);

// Reads just the config and vocabulary (to build the model before loading).
nn::GPTConfig load_config(const std::string& path, std::string* vocab_utf8);
// Loads weights, optimizer state and train state; errors name the file.
TrainState load_checkpoint(const std::string& path, nn::GPT& model, optim::Optimizer& opt);

}  // namespace loom::train
