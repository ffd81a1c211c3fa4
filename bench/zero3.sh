#!/usr/bin/env bash
# Step time of --zero 0, 1, 2 and 3 at dp 2 side by side, and ZeRO-3's exposed
# communication with and without prefetch (--zero3-prefetch off), on the
# medium GPT (6 layers, 6 heads, 384 embd, block 256, global batch 8, bf16,
# one math thread per rank). Each round runs every config once, in turn
# (interleaved, so that whatever else the machine does slows them alike); a
# run's ms/step is the median of its steps 2..N (--log), the table's the
# median over rounds, and the ratio is to ZeRO-1's. The communication columns
# come from each run's --trace through docs/trace_summary.py's step_traffic
# (rank 0, steps after the first, medians over rounds): the dp collectives'
# time on the communication track per step, and the part of it with no
# compute beside it (exposed: the compute thread idle or in a "wait for ..." span),
# and the time the compute thread was blocked in "wait for ..." spans (waited).
#   bash bench/zero3.sh [build-dir] [rounds] [steps]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
STEPS=${3:-4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=passive
REPO=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MEDIUM="--layers 6 --heads 6 --embd 384 --block 256 --steps $STEPS --warmup 1 --eval-every 0 --sample 0 --threads 1"
CONFIGS=("--zero 0" "--zero 1" "--zero 2" "--zero 3" "--zero 3 --zero3-prefetch off")
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for round in $(seq "$ROUNDS"); do
  for i in "${!CONFIGS[@]}"; do
    mpirun --oversubscribe -np 2 "$BUILD/examples/train_gpt" $MEDIUM --dp 2 --batch 4 --dtype bf16 ${CONFIGS[$i]} \
      --log "$TMP/log.jsonl" --trace "$TMP/trace.json" >"$TMP/out.txt" 2>&1 || { cat "$TMP/out.txt"; exit 1; }
    tail -n +2 "$TMP/log.jsonl" | sed 's/.*"ms": \([0-9.]*\).*/\1/' | median >>"$TMP/ms.$i"
    /usr/bin/python3 - "$TMP/trace.json" "$REPO/docs" >>"$TMP/comm.$i" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
import trace_summary
t = trace_summary.step_traffic(json.load(open(sys.argv[1]))["traceEvents"])[0]
print(t["comm_ms"], t["exposed_ms"], 100 * t["exposed_share"], t["waited_ms"])
PY
  done
  echo "round $round of $ROUNDS done" >&2
done
z1=$(median <"$TMP/ms.1")
printf "%-30s | %9s | %9s | %15s | %15s | %7s | %14s\n" config "ms/step" "/ zero 1" "dp comm ms/step" \
  "exposed ms/step" "exposed" "waited ms/step"
for i in "${!CONFIGS[@]}"; do
  ms=$(median <"$TMP/ms.$i")
  comm=$(awk '{print $1}' "$TMP/comm.$i" | median)
  exposed=$(awk '{print $2}' "$TMP/comm.$i" | median)
  share=$(awk '{print $3}' "$TMP/comm.$i" | median)
  waited=$(awk '{print $4}' "$TMP/comm.$i" | median)
  printf "%-30s | %9.0f | %8.2fx | %15.1f | %15.1f | %6.0f%% | %14.1f\n" "${CONFIGS[$i]}" "$ms" \
    "$(echo "$ms / $z1" | bc -l)" "$comm" "$exposed" "$share" "$waited"
done
echo "($ROUNDS rounds interleaved, steps 2..$STEPS of each run; medians; load average $(cut -d' ' -f1-3 /proc/loadavg))"
