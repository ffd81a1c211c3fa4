// train_gpt's command line: every flag, its default, and the CLI11 options
// that fill it (`train_gpt --help` prints them all).
#pragma once

#include <cstdint>
#include <string>

#include "data/data.h"
#include "nn/gpt.h"

namespace CLI {
class App;
}

namespace loom::train {

struct Args {
  std::string data = data::default_corpus_path();
  int64_t steps = 200, batch = 16, block = 64, layers = 4, heads = 4, embd = 128;
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0.1, grad_clip = 1.0, dropout = 0.0;
  int64_t warmup = 20;
  uint64_t seed = 1337;
  int threads = 1;
  std::string device = "cpu";  // cpu, or cuda[:N]: where the model, batches and optimizer live
  bool tf32 = false;           // --device cuda: TF32 GEMMs (faster; no longer matches the CPU run)
  std::string cuda_kernels;    // --device cuda: fast or reference row kernels ("": LOOM_CUDA_KERNELS, else reference)
  std::string backend;         // mpi or nccl: how ranks exchange tensors ("": nccl for cuda, mpi for cpu)
  int64_t eval_every = 100, eval_batches = 8, log_every = 10, save_every = 0, stop_at = 0;
  std::string save, resume, log;
  int64_t sample = 300, top_k = 0;
  double temperature = 0.8;
  // parallelism
  int dp = 1, pp = 1, tp = 1;
  bool sequence_parallel = false;
  int cp = 1;  // context parallelism: each sequence split over cp ranks, attention as a ring
  int dp_shard = 0;  // --zero 3 with HSDP: shard over groups of dp_shard dp ranks, replicated dp / dp_shard times (0: dp)
  std::string dp_mode = "bucket";
  double bucket_mb = 25.0;
  int64_t grad_accum = 1, microbatches = 0;
  std::string schedule = "1f1b", partition = "uniform";
  bool overlap_pairs = false;  // dualpipev: each pair's F and B + W compute at once (overlapped_pairs.h)
  bool print_schedule = false;
  std::string schedule_svg;  // the first step's schedule as a picture
  int virtual_stages = 1;  // model chunks per pipeline rank: interleaved 1F1B when > 1
  std::string trace;
  // precision and the optimizer
  std::string dtype = "fp32";
  int zero = 0;  // ZeRO stage: 1 shards the optimizer state (ZeRO-1), 2 also the gradients (ZeRO-2), 3 the params too (FSDP)
  bool memory_report = false;
  std::string memory_json;  // --memory-report's ledger as JSON too
  bool overlap_param_gather = false;  // --zero: wait for each bucket's param all-gather in its first layer's forward
  // --zero 3's schedule, "on" or "off" (parallel/data_parallel/fully_sharded.h, FullyShardedOptions): gather the
  // next unit while this one computes (FSDP's forward_prefetch / backward_prefetch), free each unit after its
  // forward (FSDP2's and torchtitan's reshard_after_forward)
  std::string zero3_prefetch = "on", zero3_reshard_after_forward = "on";
  double loss_scale = 65536.0, loss_scale_growth = 2.0, loss_scale_backoff = 0.5;
  int64_t loss_scale_window = 2000, inject_overflow = -1;
  // activation recomputation (parallel/recompute.h): none, selective or full
  std::string recompute = "none";
  // teaching
  std::string teach_break = "none";
  // architecture (nn/gpt.h): gpt2, or llama (RMSNorm, RoPE, SwiGLU, grouped-query attention, untied head)
  std::string arch = "gpt2";
  bool arch_given = false;    // --arch was passed: a --resume checkpoint must be of that arch
  int64_t kv_heads = 0;       // key/value heads (0: --heads; 1: multi-query)
  double rope_base = 10000.0;
  int64_t mlp_hidden = 0;     // the MLP width (0: 4C for gpt2, 8C/3 rounded up to 8 for llama)
  bool untied = false;        // an LM head of its own (llama's default)
  // Hugging Face model folders (nn/hf_checkpoint.h): start from one, write one at the end
  std::string init_from, export_hf;  // --init-from takes the model's shape from DIR/config.json
  double export_hf_shard_mb = 0.0;   // > 0: --export-hf writes shards of at most this many MiB
  std::string tokenizer;             // a tokenizer.json: byte-level BPE ids instead of characters
  std::string eod_mask_loss;         // the end-of-document token's text: no loss on the target after it ("": off)
  bool tokenizer_from_init = false;  // tokenizer is --init-from's DIR/tokenizer.json (no --tokenizer given)
  // mixture of experts (nn/moe.h; train/args_moe.cpp): experts > 0 replaces each block's MLP
  int64_t experts = 0, experts_per_token = 2, shared_experts = 0;
  double capacity_factor = 0.0, router_aux_loss_coef = 0.0, router_z_loss_coef = 0.0, router_bias_update_rate = 0.0;
  int ep = 1;  // expert parallelism: the experts' compute split over ep consecutive dp ranks
};


void add_options(CLI::App& app, Args& a);
void add_moe_options(CLI::App& app, Args& a);  // train/args_moe.cpp

// The run's MoE flags on cfg: all of them on a new model; on a --resume or
// --init-from model (whose own experts and k stand) only the routing options
// (capacity, balancing), after checking that a given --experts or
// --experts-per-token is the model's. `source` names that model in the errors.
void apply_moe_flags(nn::GPTConfig& cfg, const Args& a, const std::string& source = "");

// Every flag against the others, and every output path (--save, --log,
// --trace) for being a writable file path that destroys no input
// (paths.h), before any work. (Each numeric flag's own range is checked
// as add_options' parser reads it: "--log-every must be an integer in
// [1, 1099511627776], got '0'".)
// --device cuda[:N] is checked against the build and the machine here too: a
// machine without a GPU stops before any work ("--device cuda:0: no CUDA device (...)").
void validate(const Args& a);  // train/checks.cpp
void check_moe_flags(const Args& a);  // train/checks_moe.cpp, called by validate

// The model the flags describe: its sizes and architecture (--arch, --kv-heads,
// --rope-base, --mlp-hidden, --untied); the vocabulary is the corpus's, and a
// --resume or --init-from model replaces it with its own.
nn::GPTConfig model_config(const Args& a);

DType parse_dtype(const std::string& s);  // --dtype: "fp32" | "bf16" | "fp16"
// K, the micro-batches of one step: --microbatches (default pp) in a pipeline of pp stages, else --grad-accum.
int64_t micro_batches_per_step(const Args& a, int pp);

}  // namespace loom::train
