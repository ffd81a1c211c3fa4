#!/usr/bin/env bash
# loom_plan against loom's own runs on this machine: for each grid, train_gpt
# runs a few steps, and its median step time (steps 3.., from the JSON log)
# is printed beside loom_plan's prediction. The planner is calibrated on two
# measurements, and predicts every grid from there:
#   compute  the one-rank run (--calibrate-ms) sets the efficiency;
#   links    bench_allreduce, at each world size the grids use (2 and 4 ranks),
#            gives the latency and bandwidth of loom's all-reduce: latency from
#            a 4 KiB message, t = 2 (n - 1) alpha; bandwidth from 1 MiB,
#            t - t(4 KiB) = 2 (n - 1) / n x S / B (--latency-us, --link-gbs).
#            Per world size, because with more ranks than cores each step of a
#            ring waits for the peer to be scheduled (and loom's comm thread
#            polls flat out while a caller waits: parallel/comm/process_group_mpi.cpp),
#            which the machine's memcpy rate and MPI's ~1 us know nothing of.
# (Memory is checked exactly by tests/test_plan.cpp.)
#
# Usage: bench/plan_check.sh [build dir] [steps]
# The machine is expected to be shared (other builds): run it twice and look
# at the spread before trusting a gap.
set -euo pipefail
B=${1:-build}
STEPS=${2:-12}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A rank waiting in MPI spins on its core unless told to yield; OpenMPI yields
# by itself only when it sees more ranks than cores. On a shared machine a
# spinning rank takes the core from the rank doing the work (measured here:
# tp 2 at ~1000 ms per step spinning, tp 4 at ~60 ms yielding).
export OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
MODEL="--layers 4 --embd 128 --heads 4 --block 64 --batch 8"
OUT=$(mktemp -d)
VOCAB=""

# "LATENCY_US GBS" of loom's all-reduce on n ranks (best of bench_allreduce --quick).
declare -A LINK
fit_link() {
  local n=$1 t4 t1m
  mpirun --oversubscribe -np "$n" "$B/bench/bench_allreduce" --quick > "$OUT/allreduce$n.txt" 2>&1
  t4=$(awk '$1 == 4096 {print $3}' "$OUT/allreduce$n.txt")
  t1m=$(awk '$1 == 1048576 {print $3}' "$OUT/allreduce$n.txt")
  LINK[$n]=$(awk -v n="$n" -v a="$t4" -v b="$t1m" 'BEGIN {
    printf "%.1f %.3f", a / (2 * (n - 1)), 2 * (n - 1) / n * 1048576 / ((b - a) * 1e-6) / 1e9 }')
}

# median "ms" of steps >= 3 of a JSON-lines log
median_ms() { grep -o '"ms": [0-9.]*' "$1" | awk 'NR > 3 {print $2}' | sort -n |
              awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

run() {  # run NAME RANKS ARGS...
  local name=$1 n=$2; shift 2
  local launch=""
  [ "$n" -gt 1 ] && launch="mpirun --oversubscribe -np $n"
  $launch "$B/examples/train_gpt" $MODEL --steps "$STEPS" --eval-every 0 --sample 0 --memory-report \
    --log "$OUT/$name.jsonl" "$@" > "$OUT/$name.txt" 2>&1
  median_ms "$OUT/$name.jsonl"
}

CONFIGS=("one:1:" "dp2:2:--dp 2" "dp4:4:--dp 4" "dp2-zero-bf16:2:--dp 2 --zero --dtype bf16"
         "pp2:2:--pp 2 --microbatches 4" "pp4:4:--pp 4 --microbatches 8" "tp2:2:--tp 2" "tp4:4:--tp 4"
         "dp2-pp2:4:--dp 2 --pp 2 --microbatches 4" "dp2-tp2:4:--dp 2 --tp 2"
         "pp2-tp2-sp:4:--pp 2 --tp 2 --sequence-parallel --microbatches 4")
# Every grid REPEATS times, round-robin, keeping the fastest median: on a
# shared machine the least disturbed run is the closest to the machine's own speed.
declare -A BEST
for rep in $(seq "${REPEATS:-3}"); do
  for cfg in "${CONFIGS[@]}"; do
    IFS=: read -r name n flags <<< "$cfg"
    ms=$(run "$name" "$n" $flags)
    if [ -z "${BEST[$name]:-}" ] || (( $(echo "$ms < ${BEST[$name]}" | bc -l) )); then BEST[$name]=$ms; fi
  done
done
for n in 2 4; do fit_link "$n"; done
ONE=${BEST[one]}
VOCAB=$(grep -o 'vocab [0-9]*' "$OUT/one.txt" | head -1 | awk '{print $2}')
echo "one rank: ${ONE} ms per step (vocab $VOCAB); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "links (loom's all-reduce, latency us / GB/s): 2 ranks ${LINK[2]}, 4 ranks ${LINK[4]}"
printf "%-22s %10s %10s %8s\n" grid measured planned gap
for cfg in "${CONFIGS[@]:1}"; do
  IFS=: read -r name n flags <<< "$cfg"
  ms=${BEST[$name]}
  read -r lat gbs <<< "${LINK[$n]}"
  planned=$("$B/plan/loom_plan" $MODEL --vocab "$VOCAB" $flags --calibrate-ms "$ONE" --latency-us "$lat" --link-gbs "$gbs" |
            sed -n 's/^step time: \([0-9.]*\) \(m\?s\).*/\1 \2/p' | awk '{print ($2 == "s") ? $1 * 1000 : $1}')
  printf "%-22s %8.1f ms %7.1f ms %+7.0f%%\n" "$name" "$ms" "$planned" "$(echo "($planned - $ms) * 100 / $ms" | bc -l)"
done
echo "logs in $OUT"
