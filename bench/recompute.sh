#!/usr/bin/env bash
# Activation recomputation side by side: --recompute none, selective and full
# on one GPT, each run ROUNDS times in turn (so machine load hits every mode
# alike): the peak activation memory (train_gpt --memory-report, measured by
# the counting allocator / the formula of optim/activation_memory.h) and the
# time of a step two ways, on one thread (--threads 1):
#   cpu ms/step   the process's user + sys CPU time (bash's `time`) of a run
#                 of STEPS steps less that of a run of 1 step, / (STEPS - 1):
#                 the work a step does; time spent waiting for a core is not
#                 counted (sharing its caches and hyperthread still is).
#   wall ms/step  the median step time of the run's --log file (steps 2..N).
# On a loaded machine either moves by +-20% from round to round, so the ratio
# to none is taken within each round - the three modes ran back to back under
# the same load - and the table prints the median of those ratios over the
# rounds, with its quartiles (the ms columns are medians over the rounds; every
# round is printed below the table).
# The formula's time: full reruns every block's forward, about +1/3 of a step
# (backward costs about two forwards); selective reruns only the attention
# core, 4 b s² h of a layer's 24 b s h² + 4 b s² h forward FLOPs, / 3.
#   bash bench/recompute.sh [build-dir] [steps] [rounds] [model flags...]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-8}
ROUNDS=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
MODEL=${*:-"--layers 4 --heads 4 --embd 128 --block 128 --batch 8"}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
TIMEFORMAT='%U %S'
run() {  # mode steps -> the CPU seconds of the run (user + sys)
  local t
  t=$( { time "$BUILD/examples/train_gpt" $MODEL --threads 1 --recompute "$1" --steps "$2" --warmup 1 --eval-every 0 \
           --sample 0 --memory-report --log "$TMP/$1.jsonl" >"$TMP/$1.out" 2>&1; } 2>&1 )
  echo "$t" | awk '{print $1 + $2}'
}
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A CPU WALL PEAK
for round in $(seq "$ROUNDS"); do
  for mode in none selective full; do
    one=$(run "$mode" 1)
    many=$(run "$mode" "$STEPS")
    CPU[$mode]="${CPU[$mode]:-} $(echo "$many $one $STEPS" | awk '{print 1000 * ($1 - $2) / ($3 - 1)}')"
    PEAK[$mode]=$(grep -E '^ +0 +[0-9]+ +\|' "$TMP/$mode.out" | awk -F'|' '{gsub(/ /, "", $7); print $7}')
    WALL[$mode]="${WALL[$mode]:-} $(median "$(tail -n +2 "$TMP/$mode.jsonl" | sed 's/.*"ms": \([0-9.]*\).*/\1/')")"
  done
done
# The formula's ratio to none, from the model's h and s (--embd, --block).
h=$(echo " $MODEL " | sed -n 's/.* --embd \([0-9]*\) .*/\1/p'); h=${h:-128}
s=$(echo " $MODEL " | sed -n 's/.* --block \([0-9]*\) .*/\1/p'); s=${s:-64}
declare -A FORMULA=([none]=1 [full]=$(awk 'BEGIN {print 4 / 3}')
                    [selective]=$(awk -v h="$h" -v s="$s" 'BEGIN {print 1 + 4 * s / (24 * h + 4 * s) / 3}'))
# The median and quartiles, over the rounds, of round r's mode / none.
ratio() {  # "mode's values" "none's values" -> "median q1-q3"
  paste <(echo $1 | tr ' ' '\n') <(echo $2 | tr ' ' '\n') | awk '{print $1 / $2}' | sort -n |
    awk '{a[NR]=$1} END {q = (NR - 1) / 4; printf "%.2f %.2f-%.2f", a[int(2 * q) + 1], a[int(q) + 1], a[int(3 * q) + 1]}'
}
printf "%-10s | %22s | %11s %15s | %12s %15s | %7s\n" recompute "activ. peak MiB (m/p)" "cpu ms/step" "x none (q1-q3)" \
  "wall ms/step" "x none (q1-q3)" formula
for mode in none selective full; do
  printf "%-10s | %22s | %11.1f %15s | %12.1f %15s | %7.2f\n" "$mode" "${PEAK[$mode]}" "$(median ${CPU[$mode]})" \
    "$(ratio "${CPU[$mode]}" "${CPU[none]}")" "$(median ${WALL[$mode]})" "$(ratio "${WALL[$mode]}" "${WALL[none]}")" \
    "${FORMULA[$mode]}"
done
for mode in none selective full; do  # every round's
  printf "%-10s   by round: cpu%s | wall%s\n" "$mode" "$(printf " %.1f" ${CPU[$mode]})" "$(printf " %.1f" ${WALL[$mode]})"
done
