#include "examples/train_args.h"

#include <CLI/CLI.hpp>

namespace loom::train {

void add_options(CLI::App& app, Args& a) {
  // A flag given twice takes its last value, so wrappers can override their
  // defaults: `bash examples/train.sh --steps 50`.
  app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--data", a.data, "UTF-8 text file, or a directory of them (default: Debian's fortunes)");
  app.add_option("--steps", a.steps, "total optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--batch", a.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--block", a.block, "sequence length (block size)")->check(CLI::PositiveNumber);
  app.add_option("--layers", a.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--heads", a.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--embd", a.embd, "embedding width (divisible by --heads)")->check(CLI::PositiveNumber);
  app.add_option("--dropout", a.dropout, "dropout probability");
  app.add_option("--lr", a.lr, "peak learning rate");
  app.add_option("--min-lr-ratio", a.min_lr_ratio, "final lr as a fraction of --lr (cosine decay)");
  app.add_option("--warmup", a.warmup, "linear warmup steps");
  app.add_option("--weight-decay", a.weight_decay, "AdamW weight decay on matmul weights");
  app.add_option("--grad-clip", a.grad_clip, "clip the gradient norm to this (0: off)");
  app.add_option("--seed", a.seed, "seed for weights, data order and sampling");
  app.add_option("--threads", a.threads, "math threads (BLAS)")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", a.eval_every, "validation loss every N steps (0: never)");
  app.add_option("--eval-batches", a.eval_batches, "batches per validation");
  app.add_option("--log-every", a.log_every, "print a line every N steps when stdout is not a terminal");
  app.add_option("--save", a.save, "checkpoint path (PATH and PATH.optim.safetensors), written at the end");
  app.add_option("--save-every", a.save_every, "also checkpoint every N steps");
  app.add_option("--stop-at", a.stop_at, "stop after this many steps; the LR schedule still spans --steps (0: run to --steps)");
  app.add_option("--resume", a.resume, "resume from a checkpoint written by --save");
  app.add_option("--log", a.log, "JSON-lines log: step, loss, lr, tokens_per_s, ms (+ val_loss)");
  app.add_option("--sample", a.sample, "characters of generated text to print at the end");
  app.add_option("--temperature", a.temperature, "sampling temperature");
  app.add_option("--top-k", a.top_k, "sample from the k most likely characters (0: all)");
  app.add_option("--dp", a.dp, "data-parallel ranks (launch with mpirun -np dp*pp)")->check(CLI::PositiveNumber);
  app.add_option("--dp-mode", a.dp_mode, "naive: all-reduce each gradient; bucket: overlapped bucketed all-reduce")
      ->check(CLI::IsMember({"naive", "bucket"}));
  app.add_option("--bucket-mb", a.bucket_mb, "gradient bucket size in MB (--dp-mode bucket)");
  app.add_option("--grad-accum", a.grad_accum, "micro-batches accumulated per step")->check(CLI::PositiveNumber);
  app.add_option("--pp", a.pp, "pipeline stages (launch with mpirun -np dp*pp)")->check(CLI::PositiveNumber);
  app.add_option("--microbatches", a.microbatches, "micro-batches per step in a pipeline (0: pp)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--schedule", a.schedule, "pipeline schedule")->check(CLI::IsMember({"afab", "1f1b"}));
  app.add_option("--partition", a.partition, "how layers are cut into stages: equal counts or equal parameters")
      ->check(CLI::IsMember({"uniform", "balanced"}));
  app.add_flag("--print-schedule", a.print_schedule, "print the executed pipeline schedule and its bubble after step 1");
  app.add_option("--trace", a.trace, "write a Chrome-trace timeline (one row per rank) to this file");
  app.add_option("--dtype", a.dtype, "model params and activations; the optimizer keeps fp32 main params")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--zero", a.zero, "shard the optimizer state over the dp ranks (ZeRO-1, distributed optimizer)");
  app.add_flag("--memory-report", a.memory_report, "after step 1, print each rank's memory by kind vs the formula");
  app.add_option("--loss-scale", a.loss_scale, "fp16: initial dynamic loss scale");
  app.add_option("--loss-scale-window", a.loss_scale_window, "fp16: clean steps before the loss scale doubles")
      ->check(CLI::PositiveNumber);
  app.add_option("--loss-scale-growth", a.loss_scale_growth, "fp16: factor the scale grows by after the window");
  app.add_option("--loss-scale-backoff", a.loss_scale_backoff, "fp16: factor the scale shrinks by on an overflow");
  app.add_option("--inject-overflow", a.inject_overflow, "testing: put an inf into rank 0's gradient at this step (-1: never)");
}

}  // namespace loom::train
