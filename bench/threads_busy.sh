#!/usr/bin/env bash
# The main job at --threads 1 and 2, on a quiet machine and with one core
# kept busy by another program (a shell loop: a browser, a build), under
# loom's default (threads woken only while the cores are free,
# tensor/cpu/core_watch.h; idle ones spin 10,000 pauses, then sleep,
# tensor/cpu/thread_wait.h) and always waking the threads, with OpenMP's own
# default (spin ~300,000 pauses before sleeping) or sleeping at once
# (OMP_WAIT_POLICY=passive). Wall seconds of the whole run, best of REPEATS.
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

run() {  # run "<env assignments>" <threads>: best wall seconds of REPEATS runs
  local best=""
  for _ in $(seq "$REPEATS"); do
    local t0 t1
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # the assignments are words
    env $1 "${JOB[@]}" --threads "$2" >/dev/null 2>&1
    t1=$(date +%s.%N)
    best=$(echo "$t0 $t1 $best" | awk '{d = $2 - $1; if ($3 == "" || d < $3) print d; else print $3}')
  done
  printf "%.2f" "$best"
}

printf "%-6s %-34s | %10s %10s | %s\n" "load" "math threads" "threads 1" "threads 2" "load average"
for load in quiet busy; do
  if [ "$load" = busy ]; then
    (while :; do :; done) &
    BUSY=$!
  fi
  for policy in "LOOM_WAKE_THREADS=auto" "LOOM_WAKE_THREADS=always GOMP_SPINCOUNT=300000" \
    "LOOM_WAKE_THREADS=always OMP_WAIT_POLICY=passive"; do
    case $policy in
      *auto) name="watch cores (loom's default)" ;;
      *300000) name="always wake, spin (OpenMP's)" ;;
      *) name="always wake, sleep at once" ;;
    esac
    t1=$(run "$policy" 1)
    t2=$(run "$policy" 2)
    printf "%-6s %-34s | %9ss %9ss | %s\n" "$load" "$name" "$t1" "$t2" "$(cut -d' ' -f1-3 /proc/loadavg)"
  done
  stop_busy
done
