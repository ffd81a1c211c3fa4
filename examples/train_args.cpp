#include "examples/train_args.h"
#include "examples/train_paths.h"
#include "nn/hf_config.h"
#include "parallel/comm/process_group_nccl.h"
#include "parallel/recompute.h"
#include "parallel/teach/teach_break.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/kernel_choice.h"
#include "tensor/numbers.h"

#include <unistd.h>

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
// checkpoint has its own model). --tokenizer: ids from a tokenizer.json.
static void add_hf_options(CLI::App& app, Args& a) {
  auto read_config = [&a](const std::string& dir) {
    try {
      const nn::GPTConfig c = nn::read_hf_config((std::filesystem::path(dir) / "config.json").string());
      a.layers = c.n_layer, a.heads = c.n_head, a.embd = c.n_embd, a.block = c.block_size, a.dropout = c.dropout;
      if (nn::hf_family(c) == "llama")  // so that validate() checks --tp against its kv heads, --cp against RoPE
        a.arch = "llama", a.kv_heads = c.n_kv_head, a.rope_base = c.rope_base, a.mlp_hidden = c.mlp_hidden;
    } catch (const Error& e) {
      throw CLI::ValidationError("--init-from", e.what());
    }
  };
  CLI::Option* init = app.add_option("--init-from", a.init_from,
                                     "start from a Hugging Face GPT-2 or Llama folder (config.json + "
                                     "model.safetensors or shards); its config.json sets the model")
                          ->each(read_config);
  for (const char* flag : {"--layers", "--heads", "--embd", "--block", "--dropout", "--resume", "--arch", "--kv-heads",
                           "--rope-base", "--mlp-hidden", "--untied"})
    init->excludes(app.get_option(flag));
  app.add_option("--export-hf", a.export_hf, "at the end, write the model as a Hugging Face folder (from_pretrained "
                 "reads it)");
  number(app, "--export-hf-shard-mb", a.export_hf_shard_mb, {0.0, 1e9, " (0: one model.safetensors)"},
         "--export-hf: shards of at most this many MiB and their index (0: one file)");
  app.add_option("--tokenizer", a.tokenizer, "a Hugging Face tokenizer.json (byte-level BPE): train on its ids instead "
                 "of characters; the vocabulary is its size (--export-hf copies it)")
      ->check(CLI::ExistingFile);
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
      ->check(CLI::IsMember({"gpt2", "llama"}));
  number(app, "--kv-heads", a.kv_heads, {0, 4096}, "key/value heads (0: --heads; 1: multi-query; divides --heads)");
  number(app, "--rope-base", a.rope_base, {1.0, 1e30, "", true}, "RoPE's base (--arch llama)");
  number(app, "--mlp-hidden", a.mlp_hidden, {0, kMaxSize}, "MLP width (0: 4 x --embd, or 8/3 x for llama's SwiGLU)");
  app.add_flag("--untied", a.untied, "an LM head of its own instead of the token embedding's transpose");
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
  app.add_option("--schedule", a.schedule, "pipeline schedule")->check(CLI::IsMember({"afab", "1f1b"}));
  app.add_option("--partition", a.partition, "how layers are cut into stages: equal counts or equal parameters")
      ->check(CLI::IsMember({"uniform", "balanced"}));
  number(app, "--virtual-stages", a.virtual_stages, {1, 4096},
         "model chunks per pipeline rank; > 1: interleaved 1F1B (--microbatches a multiple of --pp)");
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
                 "ring-no-max-correction");
  add_hf_options(app, a);
}

namespace {

namespace fs = std::filesystem;

// The closest directory that exists at or above p (p's own directory part).
fs::path existing_ancestor(fs::path dir) {
  // Absolute first: a relative "out" has no parent path, but the working directory is its parent.
  dir = fs::absolute(dir.empty() ? fs::path(".") : dir);
  while (!fs::exists(dir) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
  return dir;
}

// A file path the run will write: not a directory, and its directory exists
// (or, with create_dirs, can be created) and is writable. Checked before
// training so that a typo does not cost the whole run.
void check_writable(const char* flag, const std::string& path, bool create_dirs) {
  if (path.empty()) return;
  const fs::path p(path);
  LOOM_CHECK(p.has_filename() && !fs::is_directory(p), flag, " '", path,
             "' is a directory; give a file path, e.g. '", (p / "ckpt.safetensors").string(), "'");
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const fs::path base = create_dirs ? existing_ancestor(dir) : dir;
  LOOM_CHECK(fs::is_directory(base), flag, " '", path, "': '", base.string(),
             fs::exists(base) ? "' is not a directory" : "' does not exist");
  LOOM_CHECK(access(base.c_str(), W_OK) == 0, flag, " '", path, "': the directory '", base.string(),
             "' is not writable");
  LOOM_CHECK(!fs::exists(p) || access(p.c_str(), W_OK) == 0, flag, " '", path, "' exists and is not writable");
}

// --device: a name Device parses, and for a GPU one this build and machine
// have. Every dtype and --zero run there: the fp32 main_grad buffer and
// ZeRO's param buffer live on the params' device, and a group of one rank
// moves no data. Ranks exchange GPU tensors over NCCL (the default, one GPU
// per rank) or over MPI through host memory (--backend mpi: the way 2-4
// ranks share one GPU, which NCCL refuses), for data and pipeline parallel
// alike. The tensor-parallel layers still make host buffers
// (parallel/tensor_parallel/), so --tp stays on the CPU.
void check_device(const Args& a) {
  Device d;
  try {
    d = Device(a.device);
  } catch (const Error& e) {
    throw Error(str("--device ", a.device, ": ", e.what()));
  }
  LOOM_CHECK(!a.tf32 || d.is_cuda(), "--tf32 selects the GPU's GEMM precision; it needs --device cuda");
  LOOM_CHECK(a.cuda_kernels.empty() || d.is_cuda(), "--cuda-kernels chooses the GPU's kernels; it needs --device cuda");
  if (d.is_cuda() && a.cuda_kernels.empty()) cuda::kernel_choice();  // a bad LOOM_CUDA_KERNELS fails here, not mid-step
  LOOM_CHECK(!(d.is_cpu() && a.backend == "nccl"), "--backend nccl exchanges GPU tensors; it needs --device cuda "
             "(the CPU's backend is mpi)");
  if (d.is_cpu()) return;
  LOOM_CHECK(a.tp == 1, "--device ", a.device, " with --tp ", a.tp, ": the tensor-parallel layers make host buffers "
             "for now; use --device cpu for --tp > 1");
  LOOM_CHECK((a.dp == 1 && a.pp == 1) || a.backend == "mpi" || parallel::built_with_nccl(), "--device ", a.device,
             " with --dp ", a.dp, " --pp ", a.pp, ": this build has no NCCL; --backend mpi runs the ranks' GPU "
             "tensors through host memory");
  LOOM_CHECK(built_with_cuda(), "--device ", a.device, ": ", cuda::unavailable_reason());
  const int n = cuda::device_count();
  LOOM_CHECK(n > 0, "--device ", a.device, ": no CUDA device (", cuda::unavailable_reason(), ")");
  LOOM_CHECK(d.index < n, "--device ", a.device, ": this machine has ", n, n == 1 ? " CUDA device (cuda:0)"
             : str(" CUDA devices (cuda:0 .. cuda:", n - 1, ")"));
}

}  // namespace

// --init-from is an HF folder; --export-hf replaces only an earlier HF folder, never the input.
static void check_hf_paths(const Args& a) {
  if (!a.init_from.empty())
    LOOM_CHECK(fs::is_regular_file(fs::path(a.init_from) / "config.json"), "--init-from ", a.init_from,
               ": not a Hugging Face folder (no config.json)");
  LOOM_CHECK(a.export_hf_shard_mb == 0 || !a.export_hf.empty(), "--export-hf-shard-mb needs --export-hf");
  if (a.export_hf.empty()) return;
  LOOM_CHECK(!(a.arch == "gpt2" && a.untied && a.init_from.empty()), "--export-hf with --arch gpt2 --untied: "
             "transformers' GPT2LMHeadModel ties its head to wte, so no Hugging Face class reads this model "
             "(use --arch llama, tied or --untied, or drop --untied)");
  const fs::path out(a.export_hf);
  if (fs::exists(out)) {
    LOOM_CHECK(fs::is_directory(out) && fs::exists(out / "config.json"), "--export-hf ", a.export_hf,
               " exists and is not a Hugging Face folder (no config.json): refusing to replace it");
    LOOM_CHECK(a.init_from.empty() || !fs::exists(a.init_from) || !fs::equivalent(out, a.init_from), "--export-hf ",
               a.export_hf, " is the --init-from folder: the export would replace the model it started from");
  }
  check_writable("--export-hf", (fs::path(a.export_hf) / "config.json").string(), /*create_dirs=*/true);
}

void validate(const Args& a) {
  // Each number's own range was checked as it was read (number() above); here what ties flags together.
  LOOM_CHECK(a.embd % a.heads == 0, "--embd ", a.embd, " must be divisible by --heads ", a.heads);
  LOOM_CHECK(a.kv_heads == 0 || a.heads % a.kv_heads == 0, "--kv-heads ", a.kv_heads, " must divide --heads ",
             a.heads, " (each key/value head serves --heads / --kv-heads query heads)");
  LOOM_CHECK(a.arch != "llama" || (a.embd / a.heads) % 2 == 0, "--arch llama: the head size --embd / --heads = ",
             a.embd / a.heads, " must be even (RoPE rotates pairs of features)");
  // The weights, gradients and AdamW's two moments in fp32 (16 bytes a parameter,
  // the vocabulary's rows not counted) must fit in this machine's memory.
  const double params = 12.0 * double(a.layers) * double(a.embd) * double(a.embd) + double(a.block * a.embd);
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  LOOM_CHECK(16.0 * params <= ram, "--layers ", a.layers, " --embd ", a.embd, " --block ", a.block, ": about ",
             params / 1e6, " M parameters need ", 16.0 * params / 1e9, " GB for weights, gradients and AdamW state; ",
             "this machine has ", ram / 1e9, " GB");
  // Tensor parallelism splits heads, the MLP and (with --sequence-parallel) the
  // sequence: each must divide. The vocabulary is padded instead (gpt.h).
  LOOM_CHECK(a.heads % a.tp == 0, "--tp ", a.tp, " must divide --heads ", a.heads,
             " (attention is split by heads)");
  const int64_t kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  LOOM_CHECK(kv_heads % a.tp == 0, "--tp ", a.tp, " must divide the key/value heads (--kv-heads ", kv_heads,
             "): each rank keeps the kv heads its query heads read");
  LOOM_CHECK(!a.sequence_parallel || a.tp > 1, "--sequence-parallel needs --tp > 1");
  LOOM_CHECK(!a.sequence_parallel || a.block % a.tp == 0, "--sequence-parallel: --tp ", a.tp,
             " must divide --block ", a.block, " (each rank holds block / tp positions)");
  LOOM_CHECK(a.tp == 1 || a.dropout == 0, "--dropout ", a.dropout, " with --tp ", a.tp,
             ": dropout under tensor parallelism is not supported yet (matching tp = 1's masks needs a "
             "position-keyed generator); use --dropout 0");
  if (a.virtual_stages > 1) {  // interleaved 1F1B (parallel/pipeline_parallel/interleaved_schedule.h)
    LOOM_CHECK(a.pp >= 2, "--virtual-stages ", a.virtual_stages,
               " interleaves the chunks of a pipeline; it needs --pp >= 2");
    LOOM_CHECK(a.schedule == "1f1b", "--virtual-stages ", a.virtual_stages, " runs interleaved 1F1B; --schedule ",
               a.schedule, " has no interleaved form");
    const int64_t m = a.microbatches > 0 ? a.microbatches : a.pp;
    LOOM_CHECK(m % a.pp == 0, "--virtual-stages ", a.virtual_stages, ": interleaved 1F1B needs --microbatches a "
               "multiple of --pp (Megatron's rule), got ", m, " micro-batches for pp ", a.pp);
  }
  teach::parse_break(a.teach_break);  // an unknown name lists the known ones
  LOOM_CHECK(!a.overlap_param_gather || a.zero == 1 || a.zero == 2, "--overlap-param-gather overlaps ZeRO-1/2's param "
             "all-gathers; it needs --zero 1 or 2 (ZeRO-3 gathers each unit in its own forward pre-hook)");
  if (a.cp > 1) {  // context parallelism: what is tested with it, and the zig-zag split of --block
    LOOM_CHECK(a.block % (2 * a.cp) == 0, "--cp ", a.cp, " cuts each sequence into 2 x cp = ", 2 * a.cp,
               " equal chunks (the zig-zag split), but --block ", a.block, " is not divisible by ", 2 * a.cp);
    LOOM_CHECK(a.dropout == 0, "--dropout ", a.dropout, " with --cp ", a.cp, ": dropout under context parallelism "
               "is not supported (each rank's masks would differ from one process's); use --dropout 0");
    LOOM_CHECK(a.device == "cpu", "--cp ", a.cp, " with --device ", a.device,
               ": context parallelism is tested on the CPU only so far; use --device cpu");
  }
  parallel::parse_recompute(a.recompute);  // an unknown mode names the three
  LOOM_CHECK(a.teach_break != "ring-no-max-correction" || a.cp > 1, "--teach-break ring-no-max-correction breaks "
             "ring attention's merge; it needs --cp 2 or more (one process runs the fused attention)");
  LOOM_CHECK(a.teach_break != "recompute-fresh-dropout" || (a.recompute != "none" && a.dropout > 0),
             "--teach-break recompute-fresh-dropout breaks the rerun's dropout masks; it needs --recompute selective "
             "or full and --dropout > 0 (got --recompute ", a.recompute, " --dropout ", a.dropout, ")");
  for (const auto& [flag, value] : {std::pair{"--zero3-prefetch", a.zero3_prefetch},
                                    std::pair{"--zero3-reshard-after-forward", a.zero3_reshard_after_forward}})
    LOOM_CHECK(value == "on" || a.zero == 3, flag, " ", value, " changes ZeRO-3's schedule; it needs --zero 3 (got --zero ",
               a.zero, ")");
  if (a.zero == 3) {  // ZeRO-3 (parallel/data_parallel/fully_sharded.h): what it does not do yet, and why
    LOOM_CHECK(a.pp == 1, "--zero 3 with --pp ", a.pp, ": the tied embedding's copies on the first and last stage "
               "are summed over the embedding group as whole gradients, which ZeRO-3 never keeps; use --zero 1");
    LOOM_CHECK(a.dp_mode == "bucket", "--zero 3 reduce-scatters each unit's gradient; --dp-mode ", a.dp_mode,
               " does not apply");
  }
  check_device(a);
  // Output paths, before any work is done.
  check_writable("--save", a.save, /*create_dirs=*/true);
  check_writable("--log", a.log, /*create_dirs=*/false);
  check_writable("--trace", a.trace, /*create_dirs=*/false);
  check_writable("--memory-json", a.memory_json, /*create_dirs=*/false);
  check_writable("--schedule-svg", a.schedule_svg, /*create_dirs=*/false);
  check_hf_paths(a);
  check_paths(a);  // --data a regular file; no output over an input or another output (train_paths.h)
}

}  // namespace loom::train
