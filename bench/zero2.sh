#!/usr/bin/env bash
# Step time and gradient memory of --zero 0, 1 and 2 at dp 2, side by side, on
# the medium GPT (6 layers, 6 heads, 384 embd, block 256, global batch 8,
# bf16) with 4 MiB buckets (the model's 41 MiB of fp32 gradients in about 11
# buckets, so ZeRO-2's two scratches are 8 MiB). Memory is rank 0's row of
# --memory-report; ms/step the median of steps 2..N of the --log file.
#   bash bench/zero2.sh [build-dir] [steps]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-5}
source "$(dirname "$0")/common.sh"  # $TMP, median_field, rank0_row
MEDIUM="--layers 6 --heads 6 --embd 384 --block 256 --steps $STEPS --warmup 1 --eval-every 0 --sample 0"
printf "%4s | %18s | %12s | %9s\n" zero "grads MiB m / p" "bytes/param" "ms/step"
for zero in 0 1 2; do
  out="$TMP/out.txt"
  mpirun --oversubscribe -np 2 "$BUILD/examples/train_gpt" $MEDIUM --dp 2 --batch 4 --dtype bf16 --zero "$zero" \
    --bucket-mb 4 --memory-report --log "$TMP/log.jsonl" >"$out" 2>&1
  row=$(rank0_row "$out")  # | params m / p | grads m / p | optimizer m / p | bytes/param m / p | ...
  grads=$(echo "$row" | awk -F'|' '{gsub(/ +/, " ", $3); print $3}')
  bpp=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $5); print $5}')
  ms=$(median_field ms "$TMP/log.jsonl")
  printf "%4s | %18s | %12s | %9.0f\n" "$zero" "$grads" "$bpp" "$ms"
done
