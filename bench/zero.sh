#!/usr/bin/env bash
# Optimizer memory per rank and step time, dp = 1, 2, 4, with and without
# --zero, fp32 and bf16, on the medium GPT (6 layers, 6 heads, 384 embd, block
# 256, global batch 8). Memory comes from train_gpt --memory-report (the
# counting allocator, rank 0's row); ms/step is the median of steps 2..N from
# the --log file. On a 2-core machine dp = 4 oversubscribes the cores, so step
# times there measure contention, not scaling; the memory columns are exact.
#   bash bench/zero.sh [build-dir] [steps]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-4}
source "$(dirname "$0")/common.sh"  # $TMP, median_field, rank0_row
MEDIUM="--layers 6 --heads 6 --embd 384 --block 256 --steps $STEPS --warmup 1 --eval-every 0 --sample 0"
printf "%-5s %3s %-5s | %14s %12s | %12s | %9s\n" dtype dp zero "optimizer MiB" "predicted" "bytes/param" "ms/step"
for dtype in fp32 bf16; do
  for dp in 1 2 4; do
    for zero in "" "--zero"; do
      out="$TMP/out.txt"
      mpirun --oversubscribe -np "$dp" "$BUILD/examples/train_gpt" $MEDIUM --dp "$dp" --batch $((8 / dp)) \
        --dtype "$dtype" $zero --memory-report --log "$TMP/log.jsonl" >"$out" 2>&1
      # rank 0's row: | params m / p | grads m / p | optimizer m / p | bytes/param m / p | ...
      row=$(rank0_row "$out")
      opt=$(echo "$row" | awk -F'|' '{split($4, a, "/"); print a[1]+0}')
      pred=$(echo "$row" | awk -F'|' '{split($4, a, "/"); print a[2]+0}')
      bpp=$(echo "$row" | awk -F'|' '{gsub(/ /, "", $5); print $5}')
      ms=$(median_field ms "$TMP/log.jsonl")
      printf "%-5s %3d %-5s | %14.2f %12.2f | %12s | %9.0f\n" "$dtype" "$dp" "${zero:+yes}" "$opt" "$pred" "$bpp" "$ms"
    done
  done
done
