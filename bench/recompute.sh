#!/usr/bin/env bash
# Activation recomputation side by side: --recompute none, selective and full
# on one GPT, each run ROUNDS times in turn (so machine load hits every mode
# alike): the peak activation memory (train_gpt --memory-report, measured by
# the counting allocator / the formula of optim/activation_memory.h) and the
# median ms/step of steps 2..N from the --log file, with the step-time ratio
# to none. The formula's time: full reruns every block's forward, about +1/3
# of a step (backward costs about two forwards); selective reruns only the
# attention core (4 b s² h FLOPs a layer against 24 b s h² for the linears).
#   bash bench/recompute.sh [build-dir] [steps] [rounds] [model flags...]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-8}
ROUNDS=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
MODEL=${*:-"--layers 4 --heads 4 --embd 128 --block 128 --batch 8"}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
printf "%-10s | %22s | %9s %7s\n" recompute "activ. peak MiB (m/p)" "ms/step" "x none"
declare -A MS PEAK
for round in $(seq "$ROUNDS"); do
  for mode in none selective full; do
    "$BUILD/examples/train_gpt" $MODEL --recompute "$mode" --steps "$STEPS" --warmup 1 --eval-every 0 --sample 0 \
      --memory-report --log "$TMP/$mode.jsonl" >"$TMP/$mode.out" 2>&1
    PEAK[$mode]=$(grep -E '^ +0 +[0-9]+ +\|' "$TMP/$mode.out" | awk -F'|' '{gsub(/ /, "", $7); print $7}')
    MS[$mode]="${MS[$mode]:-} $(tail -n +2 "$TMP/$mode.jsonl" | sed 's/.*"ms": \([0-9.]*\).*/\1/' | sort -n |
                                awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
  done
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(median ${MS[none]})
for mode in none selective full; do
  ms=$(median ${MS[$mode]})
  printf "%-10s | %22s | %9.1f %7.2f\n" "$mode" "${PEAK[$mode]}" "$ms" "$(echo "$ms $base" | awk '{print $1 / $2}')"
done
