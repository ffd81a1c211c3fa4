#!/usr/bin/env bash
# Data-parallel scaling (issue 4): tokens/s of train_gpt on the medium GPT
# (6 layers, 6 heads, 384 embd, block 256, vocab of the corpus) at dp = 2 vs
# dp = 1, one math thread per rank, the micro-batch per rank fixed (--batch 8):
# dp = 2 trains twice the tokens per step, so perfect scaling is 2x.
# Runs alternate, `rounds` times, so a slow spell of the VM hits both alike;
# each run's figure is the median tokens_per_s of steps 2..N of its --log file
# (step 1 warms up), and the table gives the median over rounds.
#   bash bench/dp_scaling.sh [build-dir] [steps] [rounds]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-5}
ROUNDS=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MEDIUM="--layers 6 --heads 6 --embd 384 --block 256 --batch 8 --threads 1 --steps $STEPS --warmup 1"
MEDIUM="$MEDIUM --eval-every 0 --sample 0"
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
tok_s() { tail -n +2 "$1" | sed 's/.*"tokens_per_s": \([0-9.e+]*\).*/\1/' | median; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average; $(nproc) cores)"
for r in $(seq "$ROUNDS"); do
  "$BUILD/examples/train_gpt" $MEDIUM --log "$TMP/dp1.jsonl" >/dev/null 2>&1
  tok_s "$TMP/dp1.jsonl" >>"$TMP/dp1.txt"
  mpirun -np 2 "$BUILD/examples/train_gpt" $MEDIUM --dp 2 --log "$TMP/dp2.jsonl" >/dev/null 2>&1
  tok_s "$TMP/dp2.jsonl" >>"$TMP/dp2.txt"
  echo "round $r: dp 1 $(tail -1 "$TMP/dp1.txt") tok/s, dp 2 $(tail -1 "$TMP/dp2.txt") tok/s"
done
one=$(median <"$TMP/dp1.txt")
two=$(median <"$TMP/dp2.txt")
printf "\n%-22s %12s\n" "medium GPT, 1 thread" "tokens/s"
printf "%-22s %12.0f\n" "dp 1 (batch 8)" "$one"
printf "%-22s %12.0f\n" "dp 2 (batch 8 / rank)" "$two"
awk -v a="$one" -v b="$two" 'BEGIN {printf "scaling dp2 / dp1: %.2fx (target >= 1.8x)\n", b / a}'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
