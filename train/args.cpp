// train_gpt's flags: each one's name, help and numeric range (CLI11). What
// the flags may be together is checked by validate(), train/checks.cpp.
#include "train/args.h"
#include "nn/hf_config.h"
#include "tensor/numbers.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <utility>

namespace loom::train {

namespace {

// Sizes: bounded so that products like 12 x layers x embd^2 stay far from int64's end.
constexpr int64_t kMaxSize = int64_t(1) << 20, kMaxSteps = int64_t(1) << 40;

// A numeric flag, read by loom's one parser with its allowed range
// (tensor/numbers.h): '', "6x", "-1" for the seed or a value outside the range
// stops the run before any work, in one shape: "--warmup must be an integer in
// [0, 1099511627776], got ''". Exit code 1, like every check of validate().
template <class T>
void number(CLI::App& app, const std::string& flag, T& field, const NumberRange<T>& range, const std::string& help) {
  auto read = [&field, flag, range](const CLI::results_t& given) {
    try {
      field = parse_number<T>(given.back(), flag, range);  // the last of a flag given twice
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what(), 1);
    }
    return true;
  };
  app.add_option(flag, CLI::callback_t(read), help)
      ->default_str(str(field))
      ->type_name(std::is_floating_point_v<T> ? "FLOAT" : std::is_signed_v<T> ? "INT" : "UINT");
}

}  // namespace

// --init-from DIR: the model is DIR's (config.json fills --layers, --heads,
// --embd, --block and --dropout, and for a Llama --arch, --kv-heads,
// --rope-base and --mlp-hidden, so the checks of validate() see its numbers);
// giving one of those flags (or --untied) too is refused, as is --resume (its
// checkpoint has its own model). --tokenizer: ids from a tokenizer.json;
// without it, --init-from DIR's own DIR/tokenizer.json when there is one (the
// ids the folder's model was trained on: a char vocabulary would not be).
static void add_hf_options(CLI::App& app, Args& a) {
  auto read_config = [&a](const std::string& dir) {
    try {
      const nn::GPTConfig c = nn::read_hf_config((std::filesystem::path(dir) / "config.json").string());
      a.layers = c.n_layer, a.heads = c.n_head, a.embd = c.n_embd, a.block = c.block_size, a.dropout = c.dropout;
      a.untied = !c.tied_embeddings;  // so that validate() knows whether the pipeline's stages share wte
      if (nn::hf_family(c) != "gpt2")  // so that validate() checks --tp against its kv heads, --cp against RoPE
        a.arch = "llama", a.kv_heads = c.n_kv_head, a.rope_base = c.rope_base, a.mlp_hidden = c.mlp_hidden;
      a.experts = c.moe.experts, a.experts_per_token = c.moe.experts_per_token;  // a Mixtral's, for validate()
    } catch (const Error& e) {
      throw CLI::ValidationError("--init-from", e.what());
    }
  };
  CLI::Option* init = app.add_option("--init-from", a.init_from,
                                     "start from a Hugging Face GPT-2 or Llama folder (config.json + "
                                     "model.safetensors or shards); its config.json sets the model")
                          ->each(read_config);
  for (const char* flag : {"--layers", "--heads", "--embd", "--block", "--dropout", "--resume", "--arch", "--kv-heads",
                           "--rope-base", "--mlp-hidden", "--untied", "--experts", "--experts-per-token",
                           "--shared-experts"})
    init->excludes(app.get_option(flag));
  app.add_option("--export-hf", a.export_hf, "at the end, write the model as a Hugging Face folder (from_pretrained "
                 "reads it)");
  number(app, "--export-hf-shard-mb", a.export_hf_shard_mb, {0.0, 1e9, " (0: one model.safetensors)"},
         "--export-hf: shards of at most this many MiB and their index (0: one file)");
  app.add_option("--tokenizer", a.tokenizer, "a Hugging Face tokenizer.json (byte-level BPE): train on its ids instead "
                 "of characters; the vocabulary is its size (--export-hf copies it). Default with --init-from DIR: "
                 "DIR/tokenizer.json, when there is one")
      ->check(CLI::ExistingFile);
  app.add_option("--eod-mask-loss", a.eod_mask_loss, "TEXT, one token (the end-of-document token: '%' between "
                 "fortunes, '<|endoftext|>' with a GPT-2 tokenizer): the target after it adds no loss, as Megatron's "
                 "--eod-mask-loss; the loss is then the mean over the targets kept, summed across ranks");
  app.callback([&a] {  // after every flag is read, whatever their order
    const std::filesystem::path folder_tokenizer = std::filesystem::path(a.init_from) / "tokenizer.json";
    if (a.tokenizer.empty() && !a.init_from.empty() && std::filesystem::is_regular_file(folder_tokenizer))
      a.tokenizer = folder_tokenizer.string(), a.tokenizer_from_init = true;
  });
}

void add_options(CLI::App& app, Args& a) {
  // A flag given twice takes its last value, so wrappers can override their
  // defaults: `bash examples/train.sh --steps 50`.
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", a.data, "UTF-8 text file, or a directory of them (default: Debian's fortunes)");
  number(app, "--steps", a.steps, {1, kMaxSteps}, "total optimizer steps");
  number(app, "--batch", a.batch, {1, kMaxSize},
         "sequences per micro-batch on each dp rank (global batch: dp x --batch x micro-batches)");
  number(app, "--block", a.block, {1, kMaxSize}, "sequence length (block size)");
  number(app, "--layers", a.layers, {1, 4096}, "transformer blocks");
  number(app, "--heads", a.heads, {1, 4096}, "attention heads");
  number(app, "--embd", a.embd, {1, kMaxSize}, "embedding width (divisible by --heads)");
  number(app, "--dropout", a.dropout, {0.0, 0.99}, "dropout probability");
  number(app, "--lr", a.lr, {0.0, 1e30, "", true}, "peak learning rate");
  number(app, "--min-lr-ratio", a.min_lr_ratio, {0.0, 1.0}, "final lr as a fraction of --lr (cosine decay)");
  number(app, "--warmup", a.warmup, {0, kMaxSteps}, "linear warmup steps");
  number(app, "--weight-decay", a.weight_decay, {0.0, 1e6}, "AdamW weight decay on matmul weights");
  number(app, "--grad-clip", a.grad_clip, {0.0, 1e30, " (0: off)"}, "clip the gradient norm to this (0: off)");
  number(app, "--seed", a.seed, {0, UINT64_MAX}, "seed for weights, data order and sampling");
  // The architecture (nn/gpt.h; docs: From GPT-2 to Llama).
  app.add_option("--arch", a.arch, "gpt2 (LayerNorm, learned positions, GELU, tied head) or llama (RMSNorm, RoPE, "
                                   "SwiGLU, grouped-query attention, untied head, no biases)")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->each([&a](const std::string&) { a.arch_given = true; });
  number(app, "--kv-heads", a.kv_heads, {0, 4096}, "key/value heads (0: --heads; 1: multi-query; divides --heads)");
  number(app, "--rope-base", a.rope_base, {1.0, 1e30, "", true}, "RoPE's base (--arch llama)");
  number(app, "--mlp-hidden", a.mlp_hidden, {0, kMaxSize}, "MLP width (0: 4 x --embd, or 8/3 x for llama's SwiGLU)");
  app.add_flag("--untied", a.untied, "an LM head of its own instead of the token embedding's transpose");
  add_moe_options(app, a);
  number(app, "--threads", a.threads, {1, 4096},
         "math threads (OpenMP); woken only while the cores are free, idle ones soon sleep");
  app.add_option("--device", a.device, "cpu, or cuda[:N]: one GPU holds the model, batches and optimizer");
  app.add_flag("--tf32", a.tf32, "--device cuda: TF32 tensor-core GEMMs (faster; the run no longer matches the CPU's)");
  app.add_option("--cuda-kernels", a.cuda_kernels, "--device cuda: the fast row kernels (tensor/cuda/fast/) or the "
                 "reference ones (the default until a GPU run passes them; LOOM_CUDA_KERNELS sets it too)")
      ->check(CLI::IsMember({"fast", "reference"}));
  app.add_option("--backend", a.backend, "mpi or nccl: how ranks exchange tensors (default: nccl with --device cuda, "
                 "mpi on the CPU; mpi moves GPU tensors through host memory, so ranks can share one GPU)")
      ->check(CLI::IsMember({"mpi", "nccl"}));
  number(app, "--eval-every", a.eval_every, {0, kMaxSteps, " (0: never)"}, "validation loss every N steps (0: never)");
  number(app, "--eval-batches", a.eval_batches, {1, kMaxSize}, "batches per validation");
  number(app, "--log-every", a.log_every, {1, kMaxSteps}, "print a line every N steps when stdout is not a terminal");
  app.add_option("--save", a.save, "checkpoint path (PATH and PATH.optim.safetensors), written at the end");
  number(app, "--save-every", a.save_every, {0, kMaxSteps, " (0: only at the end)"}, "also checkpoint every N steps");
  number(app, "--stop-at", a.stop_at, {0, kMaxSteps, " (0: run to --steps)"},
         "stop after this many steps; the LR schedule still spans --steps (0: run to --steps)");
  app.add_option("--resume", a.resume, "resume from a checkpoint written by --save");
  app.add_option("--log", a.log, "JSON-lines log: step, loss, lr, tokens_per_s, ms (+ val_loss)");
  number(app, "--sample", a.sample, {0, kMaxSize}, "characters (tokens with --tokenizer) of generated text to print at the end");
  number(app, "--temperature", a.temperature, {0.0, 1e6, "", true}, "sampling temperature");
  number(app, "--top-k", a.top_k, {0, kMaxSize, " (0: all)"}, "sample from the k most likely characters (0: all)");
  number(app, "--dp", a.dp, {1, 65536}, "data-parallel ranks (launch with mpirun -np dp*pp*tp)");
  number(app, "--dp-shard", a.dp_shard, {1, 65536},
         "--zero 3: shard over groups of this many dp ranks, replicated over the dp / dp-shard groups (HSDP; "
         "default: --dp, no replicas)");
  app.add_option("--dp-mode", a.dp_mode, "naive: all-reduce each gradient; bucket: overlapped bucketed all-reduce")
      ->check(CLI::IsMember({"naive", "bucket"}));
  number(app, "--bucket-mb", a.bucket_mb, {0.0, 1e6, " (1e6 MiB: 977 GiB)", true},
         "gradient bucket size in MiB (--dp-mode bucket)");
  number(app, "--grad-accum", a.grad_accum, {1, kMaxSize}, "micro-batches accumulated per step");
  number(app, "--pp", a.pp, {1, 65536}, "pipeline stages (launch with mpirun -np dp*pp*tp)");
  number(app, "--tp", a.tp, {1, 65536},
         "tensor-parallel ranks splitting each matmul (Megatron-style; divides --heads)");
  app.add_flag("--sequence-parallel", a.sequence_parallel,
               "with --tp: layernorms and the residual stream sharded along the sequence (Megatron-SP)");
  // ---- context parallelism (parallel/context_parallel/) ----
  number(app, "--cp", a.cp, {1, 65536},
         "context-parallel ranks: each sequence split over cp ranks (zig-zag chunks), attention as a ring "
         "(launch with mpirun -np dp*cp*pp*tp)");
  number(app, "--microbatches", a.microbatches, {0, kMaxSize, " (0: --pp)"},
         "micro-batches per step in a pipeline (0: pp)");
  app.add_option("--schedule", a.schedule,
                 "pipeline schedule (zb-h1: zero-bubble, backward split into B and W; zb-v and dualpipev: two "
                 "chunks per rank in a V, with --virtual-stages 2)")
      ->check(CLI::IsMember({"afab", "1f1b", "zb-h1", "zb-v", "dualpipev"}));
  app.add_option("--partition", a.partition, "how layers are cut into stages: equal counts or equal parameters")
      ->check(CLI::IsMember({"uniform", "balanced"}));
  number(app, "--virtual-stages", a.virtual_stages, {1, 4096},
         "model chunks per pipeline rank; > 1: interleaved 1F1B (--microbatches a multiple of --pp)");
  app.add_flag("--overlap-pairs", a.overlap_pairs,
               "--schedule dualpipev: run each pair's forward and backward at once, on two threads (DeepSeek's "
               "overlap)");
  app.add_flag("--print-schedule", a.print_schedule,
               "print the executed pipeline schedule and its bubble after step 2 (step 1 if only one)");
  app.add_option("--schedule-svg", a.schedule_svg, "with --pp: draw step 2's schedule (step 1's if only one), in time, to this SVG file");
  app.add_option("--trace", a.trace, "write a Chrome-trace timeline (one row per rank) to this file");
  app.add_option("--dtype", a.dtype, "model params and activations; the optimizer keeps fp32 main params")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  // --zero N, the ZeRO stage; --zero alone is 1 (the flag was a switch for ZeRO-1 before the ladder grew).
  auto zero = [&a](const CLI::results_t& given) {
    try {
      a.zero = parse_number<int>(given.back(), "--zero", {0, 3, " (0: off, 1: optimizer state, 2: + gradients, 3: "
                                                               "+ params)"});
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what(), 1);
    }
    return true;
  };
  app.add_option("--zero", CLI::callback_t(zero), "ZeRO stage over the dp ranks: 1 shards the optimizer state "
                 "(distributed optimizer), 2 the gradients too, 3 the params too (FSDP) (--zero alone: 1)")
      ->expected(0, 1)->default_str("1")->type_name("0..3");
  app.add_flag("--overlap-param-gather", a.overlap_param_gather,
               "--zero: overlap the param all-gathers with the next forward (Megatron's overlap_param_gather)");
  app.add_option("--zero3-prefetch", a.zero3_prefetch, "--zero 3: all-gather the next unit while this one computes "
                 "(FSDP's forward_prefetch/backward_prefetch); off: each unit is gathered when its layer needs it")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--zero3-reshard-after-forward", a.zero3_reshard_after_forward, "--zero 3: free each unit's "
                 "params after its forward (FSDP2's reshard_after_forward); off: keep them gathered until its backward")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_flag("--memory-report", a.memory_report, "after step 1, print each rank's memory by kind vs the formula");
  app.add_option("--memory-json", a.memory_json, "write --memory-report's ledger as JSON to this file (implies it)");
  number(app, "--loss-scale", a.loss_scale, {1.0, 1e30, " (fp16's scaler stops below 1)"},
         "fp16: initial dynamic loss scale");
  number(app, "--loss-scale-window", a.loss_scale_window, {1, int64_t(1) << 40},
         "fp16: clean steps before the loss scale doubles");
  number(app, "--loss-scale-growth", a.loss_scale_growth, {1.0, 1e6},
         "fp16: factor the scale grows by after the window");
  number(app, "--loss-scale-backoff", a.loss_scale_backoff, {1e-6, 1.0},
         "fp16: factor the scale shrinks by on an overflow");
  number(app, "--inject-overflow", a.inject_overflow, {-1, kMaxSteps, " (-1: never)"},
         "testing: put an inf into rank 0's gradient at this step (-1: never)");
  app.add_option("--recompute", a.recompute,
                 "activation recomputation: none, selective (rerun the attention core in backward) or full (each "
                 "block)");
  app.add_option("--teach-break", a.teach_break,
                 "reproduce a classic bug on purpose (parallel/teach/teach_break.h): dp-allreduce-param, "
                 "dp-divide-twice, skip-tied-sync, found-inf-wrong-group, recompute-fresh-dropout, zero3-free-before-backward, "
                 "ring-no-max-correction, tp-kv-rows-of-rank-0, zb-sync-at-b, moe-aux-unscaled");
  add_hf_options(app, a);
}

nn::GPTConfig model_config(const Args& a) {
  nn::GPTConfig cfg{0, a.block, a.layers, a.heads, a.embd, a.dropout, a.seed};
  cfg.set_arch(a.arch);  // gpt2 or llama's set of blocks, then the flags that tune it
  cfg.n_kv_head = a.kv_heads;
  cfg.rope_base = a.rope_base;
  cfg.mlp_hidden = a.mlp_hidden;
  if (a.untied) cfg.tied_embeddings = false;
  apply_moe_flags(cfg, a);
  return cfg;
}

DType parse_dtype(const std::string& s) { return s == "bf16" ? kBFloat16 : s == "fp16" ? kFloat16 : kFloat32; }

int64_t micro_batches_per_step(const Args& a, int pp) {
  return pp > 1 ? (a.microbatches > 0 ? a.microbatches : pp) : a.grad_accum;
}

}  // namespace loom::train
