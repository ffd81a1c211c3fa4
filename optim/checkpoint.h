// Sharded checkpoints of a GPT and its optimizer (Megatron's distributed
// checkpointing): save from any mix of data parallel, pipeline stages, ZeRO-1
// and dtype, and load into any other mix (train_gpt's --save / --resume).
// Every file is safetensors, written to a temp file and renamed, so an
// interrupted save never destroys the previous checkpoint.
//   PATH                         the model (world rank 0): every parameter of the
//                                whole GPT by name, in the model's dtype, and the
//                                MoE routing biases (nn/moe_bias_state.h); config
//                                and vocabulary in __metadata__ (loads in PyTorch)
//   PATH.optim.<r>.safetensors   world rank r's optimizer shard: for each main
//                                param it holds - all of a model param, or the
//                                part of it a ZeRO-1 rank owns - the fp32 main
//                                param, exp_avg, exp_avg_sq and AdamW step, named
//                                "main/<param name>/<first element>" etc.
//                                Replicas (dp ranks without --zero) hold the same
//                                state: only dp rank 0 writes.
//   PATH.optim.safetensors       the index (rank 0, written last but one, with its own
//                                checksum: checkpoint_manifest_check.h): the
//                                shard file names, the step, the data RNG, the
//                                dropout offset, the loss scale
// Loading reads the index and every shard it lists and cuts out the elements
// each rank's main params cover: a run resumes bit-exactly with the same
// layout, and reshards (gather, then re-split) when dp, pp or --zero changed.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/safetensors.h"
#include "optim/mixed_precision_optimizer.h"
#include "parallel/comm/process_group.h"
#include "parallel/tensor_parallel/shard_map.h"

namespace loom::optim {

struct TrainState {
  int64_t step = 0;                  // steps completed
  std::array<uint64_t, 4> data_rng;  // Generator::state() of the batch sampler
  uint64_t dropout_offset = 0;       // the Dropout layers' Philox offset (nn/dropout.h); 0 in older checkpoints
  std::vector<std::string> router_biases_missing;  // MoE routing biases the checkpoint lacked, left at 0
                                                   // (optim/model_checkpoint.h; nn/moe_bias_state.h)
};

std::string optimizer_path(const std::string& model_path);  // the index: PATH.optim.safetensors

// Collective over world. model_state: the whole GPT's parameters (read on
// world rank 0 only); params: this rank's named parameters (to name the
// optimizer's main params); write_shard: this rank's optimizer state is not a
// replica of a lower dp rank's. fragments: the shard to write instead of
// opt's own (tensor parallelism's joined state, checkpoint_tensor_parallel.h).
void save_checkpoint(const std::string& path, const nn::NamedTensors& model_state, const nn::GPTConfig& cfg,
                     const std::string& vocab_utf8, const MixedPrecisionOptimizer& opt,
                     const nn::NamedTensors& params, const TrainState& state, parallel::ProcessGroup& world,
                     bool write_shard, const nn::NamedTensors* fragments = nullptr);

// Reads just the config and vocabulary (to build the model before loading).
nn::GPTConfig load_config(const std::string& path, std::string* vocab_utf8);

// The model file the committed manifest at path lists, verified (its step the manifest's).
nn::SafetensorsFile load_model_piece(const std::string& path);

// Fills opt's main params and AdamW state from the shards, copies the main
// params into the model params (collective over dp under ZeRO-1) and returns
// the train state. Errors name the file and the tensor. tp_maps: with tensor
// parallelism, where each param's shard lies in the full tensor.
TrainState load_checkpoint(const std::string& path, MixedPrecisionOptimizer& opt, const nn::NamedTensors& params,
                           const parallel::ShardMaps* tp_maps = nullptr);

}  // namespace loom::optim
