#!/usr/bin/env bash
# Mixture of experts on the laptop config (docs/19-mixture-of-experts.md: 2 layers,
# 4 heads, 64 embd, block 32, batch 16; 4 experts of width 88, top-2): tokens/s
# of train_gpt's step and the share of it each step of the MoE layers takes -
# router (gate, softmax, top-k, weights, and the routing map on the host),
# permute + unpermute, expert compute - from bench_moe_phases (one layer,
# forward + backward, times the layers), and, under expert parallelism, dispatch
# + combine: the all-to-alls' time in train_gpt --ep N's --trace over the steps'.
# ep 2 and 4 run when train_gpt accepts --ep (dp = ep ranks, the same global
# batch); until then their rows say why train_gpt refused. One math thread each
# (--threads 1), so the shares hold on a busy machine; ms/step is the median of
# steps 2..N of the --log file.
#   bash bench/moe.sh [build-dir] [steps]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-30}
source "$(dirname "$0")/common.sh"  # $TMP, median_field
LAPTOP="--arch llama --experts 4 --experts-per-token 2 --mlp-hidden 88 --layers 2 --heads 4 --embd 64 --block 32
        --steps $STEPS --eval-every 0 --sample 0 --threads 1"
LAYERS=2

# One MoE layer's steps, forward + backward (ms), at 16 x 32 tokens.
"$BUILD/bench/bench_moe_phases" --tokens 512 --embd 64 --experts 4 --experts-per-token 2 --mlp-hidden 88 \
  --threads 1 --reps 100 >"$TMP/phases.txt"
phase_ms() { awk -v p="phase=$1" '$1 == p {split($2, f, "="); split($3, b, "="); print f[2] + b[2]}' "$TMP/phases.txt"; }
router=$(echo "$(phase_ms router) + $(phase_ms map)" | bc -l)
perm=$(echo "$(phase_ms permute) + $(phase_ms unpermute)" | bc -l)
experts=$(phase_ms experts)

share() { echo "100 * $LAYERS * $1 / $2" | bc -l; }

printf "%3s | %10s %9s | %7s %19s %8s %18s\n" ep tokens/s ms/step router permute+unpermute experts dispatch+combine
for ep in 1 2 4; do
  log="$TMP/ep$ep.jsonl" trace="$TMP/ep$ep.trace.json" out="$TMP/ep$ep.txt"
  if [ "$ep" = 1 ]; then
    "$BUILD/examples/train_gpt" $LAPTOP --batch 16 --log "$log" >"$out" 2>&1 || true
  else
    mpirun --oversubscribe -np "$ep" "$BUILD/examples/train_gpt" $LAPTOP --dp "$ep" --ep "$ep" \
      --batch $((16 / ep)) --log "$log" --trace "$trace" >"$out" 2>&1 || true
  fi
  if [ ! -s "$log" ]; then
    printf "%3d | refused: %s\n" "$ep" "$(grep -m1 -iE 'error|--ep|refus|not expected' "$out" | cut -c1-150)"
    continue
  fi
  ms=$(median_field ms "$log")
  a2a="-"
  if [ "$ep" != 1 ] && [ -s "$trace" ]; then  # the all-to-alls' share of each step, from rank 0's trace
    a2a=$(python3 - "$trace" <<'PY'
import json, statistics, sys
events = json.load(open(sys.argv[1]))
events = events.get("traceEvents", events) if isinstance(events, dict) else events
spans = [e for e in events if e.get("ph") == "X" and e.get("pid", 0) == 0]
# A step runs from its "forward" to the end of its "optimizer step"; the all-to-alls (the comm thread's
# all_to_all_v spans, dispatch and combine) inside it over its length, the median over steps 2..N. Each
# share is one step's own (not a sum over the run over a median step, which a slow first step or a
# loaded machine pushes past 100%).
starts = sorted(e["ts"] for e in spans if e["name"] == "forward")
ends = sorted(e["ts"] + e["dur"] for e in spans if e["name"] == "optimizer step")
a2a = [e for e in spans if any(w in e["name"].lower() for w in ("dispatch", "combine", "all_to_all", "alltoall"))]
shares = [sum(e["dur"] for e in a2a if t0 <= e["ts"] < t1) / (t1 - t0) for t0, t1 in zip(starts, ends)][1:]
print(f"{100 * statistics.median(shares):.1f}%" if shares else "-")
PY
)
  fi
  if [ "$ep" = 1 ]; then
    printf "%3d | %10.0f %9.2f | %6.1f%% %18.1f%% %7.1f%% %18s\n" "$ep" "$(median_field tokens_per_s "$log")" \
      "$ms" "$(share "$router" "$ms")" "$(share "$perm" "$ms")" "$(share "$experts" "$ms")" "$a2a"
  else  # the phases were timed at one process's tokens: only the all-to-alls' share is this run's
    printf "%3d | %10.0f %9.2f | %7s %19s %8s %18s\n" "$ep" "$(median_field tokens_per_s "$log")" "$ms" - - - "$a2a"
  fi
done
echo "(router, permute + unpermute, experts: bench_moe_phases' one-process times x $LAYERS layers over ep 1's step;"
echo " $(tail -1 "$TMP/phases.txt"))"
