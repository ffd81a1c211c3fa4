// train_gpt's checks of its flags, run on every rank before any work: each
// combination loom cannot run (or that would fail mid-run: an unwritable
// output, a missing GPU) stops here with a message naming the flags and their
// values (exit code 1). The flags themselves, and each number's own range,
// are train/args.cpp's.
#include "train/args.h"
#include "train/paths.h"
#include "parallel/comm/process_group_nccl.h"
#include "parallel/context_parallel/zigzag.h"
#include "parallel/pipeline_parallel/partition.h"
#include "parallel/recompute.h"
#include "parallel/teach/teach_break.h"
#include "parallel/tensor_parallel/gpt.h"
#include "tensor/cuda/cuda.h"
#include "tensor/cuda/kernel_choice.h"

#include <unistd.h>

#include <filesystem>

namespace loom::train {

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
  LOOM_CHECK(!(a.arch == "gpt2" && a.kv_heads > 0 && a.kv_heads != a.heads && a.init_from.empty()),
             "--export-hf with --arch gpt2 --kv-heads ", a.kv_heads, " (of --heads ", a.heads,
             "): transformers' GPT2LMHeadModel has one key/value head per query head, so no Hugging Face class "
             "reads this model (use --arch llama, or drop --kv-heads)");
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
  // sequence: each must divide (parallel/tensor_parallel/gpt.h).
  check_moe_flags(a);  // --experts: the model (llama), and what it does not compose with yet
  parallel::check_tensor_parallel_split(model_config(a), a.tp, a.sequence_parallel);
  LOOM_CHECK(!a.sequence_parallel || a.tp > 1, "--sequence-parallel needs --tp > 1");
  LOOM_CHECK(a.tp == 1 || a.dropout == 0, "--dropout ", a.dropout, " with --tp ", a.tp,
             ": dropout under tensor parallelism is not supported yet (matching tp = 1's masks needs a "
             "position-keyed generator); use --dropout 0");
  // Each Dropout draws its mask by (its seed, its call count, the element's index in its input): a batch
  // split over ranks or micro-batches draws other masks than the whole batch does in one process.
  const int64_t pipeline_micro_batches = a.microbatches > 0 ? a.microbatches : a.pp;  // --microbatches 0: pp
  const int64_t micro = a.pp > 1 ? pipeline_micro_batches : 1;
  LOOM_CHECK(a.dropout == 0 || (a.dp == 1 && a.grad_accum == 1 && micro == 1), "--dropout ", a.dropout,
             " with --dp ", a.dp, " --grad-accum ", a.grad_accum, " and ", micro,
             " pipeline micro-batches: dropout on a split batch is not supported yet (each part would draw the "
             "masks of the batch's first rows, not one process's; matching them needs a position-keyed "
             "generator); use --dropout 0, or one part");
  const bool v_shape = parallel::schedule_chunk_layout(a.schedule) == parallel::ChunkLayout::V;
  if (v_shape) {  // ZB-V and DualPipeV: two chunks per rank in a V (parallel/pipeline_parallel/zbv_schedule.h)
    LOOM_CHECK(a.virtual_stages == 2, "--schedule ", a.schedule, " lays two chunks on every rank in a V; it needs "
               "--virtual-stages 2 (got --virtual-stages ", a.virtual_stages, ")");
    LOOM_CHECK(a.schedule != "dualpipev" || pipeline_micro_batches >= 2 * a.pp, "--schedule dualpipev needs at least "
               "2 pp micro-batches (one per virtual stage), got ", pipeline_micro_batches, " for pp ", a.pp,
               "; use --microbatches ", 2 * a.pp);
    LOOM_CHECK(a.teach_break != "skip-tied-sync", "--teach-break skip-tied-sync with --schedule ", a.schedule,
               ": the V puts both ends of the model on stage 0, so the tied embedding is one tensor and there is no "
               "sync to skip");
  } else if (a.virtual_stages > 1) {  // interleaved 1F1B (parallel/pipeline_parallel/interleaved_schedule.h)
    LOOM_CHECK(a.pp >= 2, "--virtual-stages ", a.virtual_stages,
               " interleaves the chunks of a pipeline; it needs --pp >= 2");
    LOOM_CHECK(a.schedule == "1f1b", "--virtual-stages ", a.virtual_stages, " runs interleaved 1F1B; --schedule ",
               a.schedule, " has no interleaved form (zb-v and dualpipev lay 2 chunks in a V)");
    const int64_t m = pipeline_micro_batches;
    LOOM_CHECK(m % a.pp == 0, "--virtual-stages ", a.virtual_stages, ": interleaved 1F1B needs --microbatches a "
               "multiple of --pp (Megatron's rule), got ", m, " micro-batches for pp ", a.pp);
  }
  // Zero bubble: B and W split (parallel/pipeline_parallel/zero_bubble_schedule.h).
  if (parallel::schedule_splits_backward(a.schedule)) {
    LOOM_CHECK(a.pp >= 2, "--schedule ", a.schedule, " orders a pipeline's backwards; it needs --pp >= 2 (got --pp ",
               a.pp, ")");
    LOOM_CHECK(a.device == "cpu", "--schedule ", a.schedule, " with --device ", a.device,
               ": the zero-bubble schedules are tested on the CPU only so far; use --device cpu");
  }
  if (a.overlap_pairs) {  // DualPipeV's pairs at once (parallel/pipeline_parallel/overlapped_pairs.h)
    LOOM_CHECK(a.schedule == "dualpipev", "--overlap-pairs runs DualPipeV's pairs at once; it needs --schedule "
               "dualpipev (got --schedule ", a.schedule, ")");
    // What talks inside a chunk would post collectives on one group from the pair's two threads, in an order
    // that differs across ranks.
    using Flag = std::pair<std::string, bool>;
    for (const auto& [flag, on] : {Flag{str("--tp ", a.tp), a.tp > 1}, Flag{str("--cp ", a.cp), a.cp > 1},
                                   Flag{str("--ep ", a.ep), a.ep > 1}, Flag{"--zero 3", a.zero == 3},
                                   Flag{"--overlap-param-gather", a.overlap_param_gather}})
      LOOM_CHECK(!on, "--overlap-pairs with ", flag, ": the pair's forward and backward would both talk inside "
                 "their chunks, on one process group from two threads, in an order that differs across ranks; "
                 "drop ", flag, " or --overlap-pairs");
  }
  teach::parse_break(a.teach_break);  // an unknown name lists the known ones
  LOOM_CHECK(!a.overlap_param_gather || a.zero == 1 || a.zero == 2, "--overlap-param-gather overlaps ZeRO-1/2's param "
             "all-gathers; it needs --zero 1 or 2 (ZeRO-3 gathers each unit in its own forward pre-hook)");
  if (a.cp > 1) {  // context parallelism: what is tested with it, and the zig-zag split of --block
    parallel::check_zigzag_split(a.block, a.cp);  // parallel/context_parallel/zigzag.h
    LOOM_CHECK(a.dropout == 0, "--dropout ", a.dropout, " with --cp ", a.cp, ": dropout under context parallelism "
               "is not supported (each rank's masks would differ from one process's); use --dropout 0");
    LOOM_CHECK(a.device == "cpu", "--cp ", a.cp, " with --device ", a.device,
               ": context parallelism is tested on the CPU only so far; use --device cpu");
  }
  parallel::parse_recompute(a.recompute);  // an unknown mode names the three
  LOOM_CHECK(a.teach_break != "zb-sync-at-b" || (a.schedule == "zb-h1" && a.dp > 1), "--teach-break zb-sync-at-b "
             "breaks where the zero-bubble schedule syncs data parallelism; it needs --schedule zb-h1 and --dp 2 or "
             "more (got --schedule ", a.schedule, " --dp ", a.dp, ")");
  LOOM_CHECK(a.teach_break != "ring-no-max-correction" || a.cp > 1, "--teach-break ring-no-max-correction breaks "
             "ring attention's merge; it needs --cp 2 or more (one process runs the fused attention)");
  LOOM_CHECK(a.teach_break != "recompute-fresh-dropout" || (a.recompute != "none" && a.dropout > 0),
             "--teach-break recompute-fresh-dropout breaks the rerun's dropout masks; it needs --recompute selective "
             "or full and --dropout > 0 (got --recompute ", a.recompute, " --dropout ", a.dropout, ")");
  for (const auto& [flag, value] : {std::pair{"--zero3-prefetch", a.zero3_prefetch},
                                    std::pair{"--zero3-reshard-after-forward", a.zero3_reshard_after_forward}})
    LOOM_CHECK(value == "on" || a.zero == 3, flag, " ", value, " changes ZeRO-3's schedule; it needs --zero 3 (got --zero ",
               a.zero, ")");
  if (a.dp_shard) {  // HSDP (fully_sharded.h): ZeRO-3 within groups of dp ranks, replicated across them
    LOOM_CHECK(a.zero == 3, "--dp-shard ", a.dp_shard, " shards ZeRO-3's params over groups of dp ranks (hybrid "
               "sharding); it needs --zero 3 (got --zero ", a.zero, "; ZeRO-1/2 shard over all of --dp)");
    LOOM_CHECK(a.dp % a.dp_shard == 0, "--dp-shard ", a.dp_shard, " must divide --dp ", a.dp, " (ZeRO-3 shards over "
               "groups of dp-shard ranks, replicated dp / dp-shard times)");
  }
  if (a.zero == 3) {  // ZeRO-3 (parallel/data_parallel/fully_sharded.h): what it does not do yet, and why
    // (With --pp and a tied wte, its copies on the first and last stage are units of their own, whose grad
    // shards finalize_model_grads sums over the embedding group: fully_sharded.h's own_units.)
    LOOM_CHECK(a.teach_break != "skip-tied-sync", "--teach-break skip-tied-sync with --zero 3: its symptom "
               "measures the distance between the whole wte copies, which ZeRO-3 keeps only as shards; use --zero 0, "
               "1 or 2");
    LOOM_CHECK(a.dp_mode == "bucket", "--zero 3 reduce-scatters each unit's gradient; --dp-mode ", a.dp_mode,
               " does not apply");
    // --memory-report's activation peak counts ZeRO-3's units through 1F1B, AFAB, ZB-H1 and interleaved 1F1B
    // (optim/zero3_activations.h). A V's two chunks, whose units are reduce-scattered at W, are not walked yet
    // (zb-v, --dp 2 --pp 2: +7.6% above the formula on stage 0, -4.1% on stage 1). ZB-H1's B under
    // --recompute full is refused at every ZeRO level below.
    LOOM_CHECK(!a.memory_report || !v_shape, "--memory-report with --zero 3 and --schedule ", a.schedule,
               ": the activation formula does not walk ZeRO-3's units through a V's chunks yet; drop --memory-report, "
               "--zero 3 or --schedule ", a.schedule);
  }
  // --memory-report under the zero-bubble schedules (B and W split: optim/split_backward.cpp's walk). Not walked
  // yet: B's reruns under --recompute full (measured above the formula by 19-25% on stage 0 under zb-h1 at
  // --layers 4, 10-17% on zb-v's and dualpipev's last stage; --zero 3 +42%), and the sequence-parallel gathers
  // B keeps (--tp 2 --sequence-parallel bf16: +3.0% to +5.3% under zb-h1 and zb-v). --tp without sequence
  // parallelism measured within 0.2% of it, --cp and selective recomputation equal to it.
  const bool split_backward = parallel::schedule_splits_backward(a.schedule);
  for (const auto& [flag, given] : {std::pair<std::string, bool>{"--recompute full", a.recompute == "full"},
                                    std::pair<std::string, bool>{"--sequence-parallel", a.sequence_parallel}})
    LOOM_CHECK(!a.memory_report || !split_backward || !given, "--memory-report with --schedule ", a.schedule, " and ",
               flag, ": the activation formula's walk of the split backward does not count what ", flag,
               " keeps through B yet; drop --memory-report, ", flag, " or --schedule ", a.schedule);
  check_device(a);
  // Output paths, before any work is done.
  check_writable("--save", a.save, /*create_dirs=*/true);
  check_writable("--log", a.log, /*create_dirs=*/false);
  check_writable("--trace", a.trace, /*create_dirs=*/false);
  check_writable("--memory-json", a.memory_json, /*create_dirs=*/false);
  check_writable("--schedule-svg", a.schedule_svg, /*create_dirs=*/false);
  check_hf_paths(a);
  check_paths(a);  // --data a regular file; no output over an input or another output (paths.h)
}

}  // namespace loom::train
