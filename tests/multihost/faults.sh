#!/usr/bin/env bash
# faults.sh TRAIN_GPT CORPUS MODE: what a multi-host job does when something
# breaks, run inside hosts.sh (2 or 3 hosts, one rank each). The job is
# train_gpt --dp N launched the way a user would, by examples/launch.sh on h0
# (tests/multihost/mpirun.sh); each rank's stderr is also kept in a file per
# rank (mpirun --output-filename), since a cut-off host's output never
# reaches mpirun. Modes:
#   kill     SIGKILL the rank on h2 (3 hosts): every rank on every host is gone
#            and the command returns non-zero within 15 s, with Open MPI's
#            message naming the rank and its host.
#   srun-kill  the same under Slurm (inside slurm.sh; 2 hosts, the rank on
#            h1): launch.sh --srun's --kill-on-bad-exit=1 ends rank 0 and
#            srun within 15 s, srun naming the task and its host. (Without
#            it, rank 0 would wait in its all-reduce for the watchdog.)
#   cut      pull h1's cable mid-training, LOOM_COLLECTIVE_TIMEOUT=5: each
#            rank's watchdog fires, names the other rank and its host as
#            unreachable or dead, and the rank is gone within 5 + 3 (asking
#            the peers) + 5 (MPI_Abort's grace) + 3 s slack; the command
#            returns non-zero within 5 + 3 + 10 (launch.sh's grace) + 7 s.
#            (mpirun alone would wait for h1's daemon as long as the link is down.)
#   frozen   the same, with h1's daemon (orted) stopped at the cut, so that
#            rank 1's MPI_Abort is never answered: it must leave by its own
#            grace all the same, within the same 16 s.
#   keepalive  pull h1's cable with the watchdog at 60 s and launch.sh
#            --keepalive 8: Open MPI's own keepalive on mpirun's channel ends
#            the job on both hosts (mpirun, every rank, h1's daemon) within
#            8 + 6 s, naming h1, before any watchdog fires.
#   flap     h1's cable out for 4 s, LOOM_COLLECTIVE_TIMEOUT=30: TCP
#            retransmits, the job finishes every step with exit code 0.
#   missing  a hostfile naming a host that does not exist: launch.sh refuses
#            within 10 s naming it, and starts nothing.
#   netdown  h1 answers (its "ssh" works) but its cable is out before the
#            launch: mpirun alone would wait for h1's daemon forever;
#            launch.sh --startup 10 names h1 and exits 1 within 30 s.
set -uo pipefail
train=$1 corpus=$2 mode=$3
here=$(cd "$(dirname "$0")" && pwd)
d=${LOOM_MH_DIR:?faults.sh runs inside hosts.sh}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
fail() {
  echo "faults.sh $mode: FAIL: $*"
  echo "---- the command's output"; cat "$d/out.txt" 2>/dev/null
  for f in "$d"/ranks/*/rank.*/stderr; do [ -s "$f" ] && { echo "---- $f"; cat "$f"; }; done
  exit 1
}
pass() { echo "faults.sh $mode: PASS: $*"; exit 0; }
steps_logged() { [ -f "$d/log.jsonl" ] && wc -l < "$d/log.jsonl" || echo 0; }
# The train_gpt processes running on a host: by the executable, not the
# command name, which is "exe" after tensor/cpu/thread_wait.cpp's re-execution
# through /proc/self/exe.
ranks_on() {
  for p in $("$here/hosts.sh" pids "$1"); do
    [ "$(basename "$(readlink /proc/"$p"/exe 2> /dev/null)")" = train_gpt ] && echo "$p"
  done
}

# start_job RANKS STEPS [srun]: train_gpt --dp RANKS in the background ($job),
# launched by mpirun (each rank's stderr in a file too), or by srun.
start_job() {
  local launch=("$LOOM_MH_MPIRUN" --output-filename "$d/ranks")
  [ "${3:-}" = srun ] && launch=("${LOOM_MH_SRUN:?srun-kill runs inside slurm.sh}")
  "${launch[@]}" -np "$1" "$train" --dp "$1" --steps "$2" --layers 2 --heads 2 \
    --embd 32 --block 16 --batch 4 --threads 1 --eval-every 0 --sample 0 --data "$corpus" --log "$d/log.jsonl" \
    > "$d/out.txt" 2>&1 &
  job=$!
}
# Until the job has logged N steps (it is training, every link in use).
wait_for_steps() {
  local deadline=$(($(now_ms) + 60000))
  while [ "$(steps_logged)" -lt "$1" ]; do
    kill -0 "$job" 2> /dev/null || fail "the job ended before logging $1 steps"
    [ "$(now_ms)" -lt "$deadline" ] || fail "no $1 steps logged within 60 s"
    sleep 0.2
  done
}
# Polls until the job has ended and no rank runs on the hosts, or LIMIT_S;
# sets job_ms, and gone_ms[host] (when its last rank went), from t0.
watch_end() {
  local limit_ms=$(($1 * 1000)) hosts=$2 h
  job_ms="" rc=""
  declare -gA gone_ms=()
  while [ $(($(now_ms) - t0)) -lt "$limit_ms" ]; do
    if [ -z "$job_ms" ] && ! kill -0 "$job" 2> /dev/null; then
      job_ms=$(($(now_ms) - t0)); wait "$job"; rc=$?
    fi
    for ((h = 0; h < hosts; h++)); do
      [ -z "${gone_ms[$h]:-}" ] && [ -z "$(ranks_on "h$h")" ] && gone_ms[$h]=$(($(now_ms) - t0))
    done
    [ -n "$job_ms" ] && [ ${#gone_ms[@]} -eq "$hosts" ] && return
    sleep 0.2
  done
}

case "$mode" in
  kill)
    export LOOM_COLLECTIVE_TIMEOUT=600  # not the watchdog: mpirun must notice the death itself
    start_job 3 100000
    wait_for_steps 3
    victim=$(ranks_on h2)
    [ -n "$victim" ] || fail "no train_gpt running on h2"
    t0=$(now_ms)
    kill -9 $victim
    watch_end 30 3
    [ -n "$job_ms" ] || fail "the command still runs 30 s after rank 2 was killed"
    [ "$rc" -ne 0 ] || fail "the command exited 0"
    for h in 0 1 2; do [ -n "${gone_ms[$h]:-}" ] || fail "a rank still runs on h$h 30 s after"; done
    [ "$job_ms" -le 15000 ] || fail "the command took $job_ms ms to return (limit 15000)"
    grep -Eq "process rank 2 with PID [0-9]+ on node h2 exited on signal 9" "$d/out.txt" ||
      fail "no message naming rank 2 and host h2"
    pass "killed rank 2 on h2: command exit code $rc after $job_ms ms; ranks gone: h0 ${gone_ms[0]} ms," \
         "h1 ${gone_ms[1]} ms, h2 ${gone_ms[2]} ms"
    ;;
  srun-kill)
    export LOOM_COLLECTIVE_TIMEOUT=600  # not the watchdog: Slurm must end the job itself
    start_job 2 100000 srun
    wait_for_steps 3
    victim=$(ranks_on h1)
    [ -n "$victim" ] || fail "no train_gpt running on h1"
    t0=$(now_ms)
    kill -9 $victim
    watch_end 30 2
    [ -n "$job_ms" ] || fail "srun still runs 30 s after rank 1 was killed"
    [ "$rc" -ne 0 ] || fail "srun exited 0"
    for h in 0 1; do [ -n "${gone_ms[$h]:-}" ] || fail "a rank still runs on h$h 30 s after"; done
    [ "$job_ms" -le 15000 ] || fail "srun took $job_ms ms to return (limit 15000)"
    grep -q "srun: error: h1: task 1: Killed" "$d/out.txt" || fail "no message naming task 1 and host h1"
    pass "killed rank 1 on h1: srun exit code $rc after $job_ms ms; ranks gone: h0 ${gone_ms[0]} ms, h1 ${gone_ms[1]} ms"
    ;;
  cut | frozen)
    export LOOM_COLLECTIVE_TIMEOUT=5 LOOM_LAUNCH_GRACE=10
    start_job 2 100000
    wait_for_steps 3
    t0=$(now_ms)
    "$here/hosts.sh" cut h1
    if [ "$mode" = frozen ]; then
      for p in $("$here/hosts.sh" pids h1); do [ "$(cat /proc/"$p"/comm)" = orted ] && kill -STOP "$p"; done
    fi
    watch_end 40 2
    [ -n "${gone_ms[0]:-}" ] && [ -n "${gone_ms[1]:-}" ] || fail "ranks still run 40 s after the cut"
    for h in 0 1; do [ "${gone_ms[$h]}" -le 16000 ] || fail "the rank on h$h took ${gone_ms[$h]} ms to go (limit 16000)"; done
    [ -n "$job_ms" ] || fail "the command still runs 40 s after the cut"
    [ "$rc" -ne 0 ] || fail "the command exited 0"
    [ "$job_ms" -le 25000 ] || fail "the command took $job_ms ms to return (limit 25000)"
    msg="a peer is unreachable or dead"
    grep -Eq "\[loom rank 0\] collective watchdog: .*No answer within 3 s from rank 1 \(h1\): $msg" "$d/out.txt" ||
      fail "rank 0 did not say that rank 1 on h1 is unreachable"
    # Rank 1's file is written by h1's daemon, which is stopped in the frozen case.
    [ "$mode" = frozen ] || grep -Eq "\[loom rank 1\] collective watchdog: .*No answer within 3 s from rank 0 \(h0\): $msg" \
      "$d"/ranks/*/rank.1/stderr || fail "rank 1 did not say that rank 0 on h0 is unreachable"
    grep -q "launch.sh: a rank failed 10 s ago and mpirun is still waiting" "$d/out.txt" ||
      fail "launch.sh did not say why it stopped mpirun"
    pass "cut h1's link: ranks gone after h0 ${gone_ms[0]} ms, h1 ${gone_ms[1]} ms; command exit code $rc after $job_ms ms"
    ;;
  keepalive)
    export LOOM_COLLECTIVE_TIMEOUT=60 LOOM_LAUNCH_KEEPALIVE=8
    start_job 2 100000
    wait_for_steps 3
    t0=$(now_ms)
    "$here/hosts.sh" cut h1
    watch_end 40 2
    [ -n "$job_ms" ] || fail "the command still runs 40 s after the cut"
    [ "$rc" -ne 0 ] || fail "the command exited 0"
    for h in 0 1; do [ -n "${gone_ms[$h]:-}" ] || fail "a rank still runs on h$h 40 s after the cut"; done
    [ "$job_ms" -le 14000 ] || fail "the command took $job_ms ms to return (limit 14000)"
    [ -z "$("$here/hosts.sh" pids h1)" ] || fail "h1's daemon still runs"
    grep -q "ORTE has lost communication with a remote daemon" "$d/out.txt" &&
      grep -Eq "Remote daemon: \[\[[0-9]+,0\],1\] on node h1" "$d/out.txt" || fail "no message naming h1's daemon"
    grep -q "collective watchdog" "$d/out.txt" && fail "the watchdog fired: Open MPI's keepalive should have acted first"
    pass "cut h1's link: Open MPI ended the job in $job_ms ms (exit code $rc); ranks gone after h0 ${gone_ms[0]} ms," \
         "h1 ${gone_ms[1]} ms; h1's daemon gone too"
    ;;
  flap)
    export LOOM_COLLECTIVE_TIMEOUT=30
    start_job 2 150
    wait_for_steps 3
    before=$(steps_logged)
    t0=$(now_ms)
    "$here/hosts.sh" cut h1
    sleep 4
    "$here/hosts.sh" mend h1
    during=$(steps_logged)
    watch_end 90 2
    [ -n "$job_ms" ] || fail "the job did not finish within 90 s of the cut"
    [ "$rc" -eq 0 ] || fail "the job failed (exit code $rc)"
    [ "$(steps_logged)" -eq 150 ] || fail "$(steps_logged) steps logged, not 150"
    # dozens of steps in 4 s with the link up; a step or two finish between reading
    # the count and the cut, and the one that was running
    [ $((during - before)) -le 3 ] || fail "$((during - before)) steps while the link was down: it was not cut"
    pass "h1's link down 4 s at step $before: $((during - before)) steps meanwhile, all 150 done, exit code 0 at $job_ms ms"
    ;;
  missing)
    printf 'h0 slots=1\nh1 slots=1\nh7 slots=1\n' > "$d/bad_hostfile"
    t0=$(now_ms)
    LOOM_LAUNCH_AGENT="$here/on_host.sh" "$here/on_host.sh" h0 "$(printf '%q ' "$here/../../examples/launch.sh" \
      --hostfile "$d/bad_hostfile" -np 3 "$train" --dp 3)" > "$d/out.txt" 2>&1
    rc=$? ms=$(($(now_ms) - t0))
    [ "$rc" -ne 0 ] || fail "launch.sh exited 0"
    [ "$ms" -le 10000 ] || fail "launch.sh took $ms ms (limit 10000)"
    grep -q "launch.sh: host 'h7' (hostfile $d/bad_hostfile) does not answer" "$d/out.txt" || fail "h7 not named"
    pass "refused in $ms ms, exit code $rc: $(cat "$d/out.txt")"
    ;;
  netdown)
    "$here/hosts.sh" cut h1
    t0=$(now_ms)
    LOOM_LAUNCH_STARTUP=10 "$LOOM_MH_MPIRUN" -np 2 "$train" --dp 2 > "$d/out.txt" 2>&1
    rc=$? ms=$(($(now_ms) - t0))
    [ "$rc" -ne 0 ] || fail "launch.sh exited 0"
    [ "$ms" -le 30000 ] || fail "launch.sh took $ms ms (limit 30000)"
    grep -q "did not all call back within 10 s (--startup); hosts that cannot reach this one on 192.0.2.0/24: 'h1'\." \
      "$d/out.txt" || fail "h1 not named"
    [ -z "$(ranks_on h0)$(ranks_on h1)" ] || fail "ranks left running"
    pass "refused in $ms ms, exit code $rc: $(grep launch.sh "$d/out.txt")"
    ;;
  *) echo "faults.sh: unknown mode '$mode'"; exit 2 ;;
esac
