#!/usr/bin/env bash
# The main job at --threads 1 and 2, on a quiet machine and with one core
# kept busy by another program (a shell loop: a browser, a build), under
# loom's default (idle math threads sleep: OMP_WAIT_POLICY=passive,
# tensor/cpu/thread_wait.h) and under OpenMP's own default (spin ~300,000
# pauses before sleeping: GOMP_SPINCOUNT=300000). Wall seconds of the whole
# run, best of REPEATS.
#   bash bench/threads_busy.sh [build-dir] [steps] [repeats]
# On a machine shared with other work, "quiet" is only as quiet as it is:
# the load average is printed beside each row.
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-60}
REPEATS=${3:-2}
JOB=("$BUILD/examples/train_gpt" --steps "$STEPS" --eval-every 0 --sample 0 --log-every 1000)
BUSY=""
stop_busy() { if [ -n "$BUSY" ]; then kill "$BUSY" 2>/dev/null || true; wait "$BUSY" 2>/dev/null || true; BUSY=""; fi; }
trap stop_busy EXIT

run() {  # run <env assignment> <threads>: best wall seconds of REPEATS runs
  local best=""
  for _ in $(seq "$REPEATS"); do
    local t0 t1
    t0=$(date +%s.%N)
    env "$1" "${JOB[@]}" --threads "$2" >/dev/null 2>&1
    t1=$(date +%s.%N)
    best=$(echo "$t0 $t1 $best" | awk '{d = $2 - $1; if ($3 == "" || d < $3) print d; else print $3}')
  done
  printf "%.2f" "$best"
}

printf "%-6s %-34s | %10s %10s | %s\n" "load" "idle math threads" "threads 1" "threads 2" "load average"
for load in quiet busy; do
  if [ "$load" = busy ]; then
    (while :; do :; done) &
    BUSY=$!
  fi
  for policy in "OMP_WAIT_POLICY=passive" "GOMP_SPINCOUNT=300000"; do
    name=$([ "$policy" = "OMP_WAIT_POLICY=passive" ] && echo "sleep (loom's default)" || echo "spin (OpenMP's default)")
    t1=$(run "$policy" 1)
    t2=$(run "$policy" 2)
    printf "%-6s %-34s | %9ss %9ss | %s\n" "$load" "$name" "$t1" "$t2" "$(cut -d' ' -f1-3 /proc/loadavg)"
  done
  stop_busy
done
