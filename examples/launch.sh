#!/usr/bin/env bash
# launch.sh: runs a loom program on several machines, with what a multi-host
# run needs and the launcher does not do by itself: Open MPI's mpirun and a
# hostfile, or Slurm's srun (--srun, below). docs/11-many-machines.md is the
# chapter.
#
#   examples/launch.sh --hostfile hosts.txt --subnet 10.1.0.0/16 -np 8 build/examples/train_gpt --dp 8 ...
#   examples/launch.sh --subnet 10.1.0.0/16 --srun -N 2 --ntasks-per-node 4 build/examples/train_gpt --dp 8 ...
#
# hosts.txt names one machine a line with its ranks: `node1 slots=4`. Every
# machine needs the same loom build at the same path (a shared file system,
# or the same install), and mpirun reaches them with ssh (keys, no password).
#
# What it adds to mpirun:
# - a check that every host answers (ssh HOST true, 10 s) before anything
#   starts: an unreachable host fails at once, named, instead of mpirun
#   waiting on a daemon that never calls back;
# - a bound on the start: mpirun waits forever for a daemon that cannot call
#   back (ssh reaches the host, but the --subnet network does not: measured,
#   still waiting after 100 s; orte_startup_timeout does not cover it). If
#   the job map (--display-map, printed once every daemon is up) has not
#   appeared within --startup seconds (default 120, LOOM_LAUNCH_STARTUP),
#   launch.sh names the hosts that cannot open a TCP connection back to this
#   one on --subnet, stops mpirun and exits 1;
# - --subnet: MPI's traffic (btl_tcp_if_include) and mpirun's own channel to
#   its daemons (oob_tcp_if_include) on one network, the fast one; without it
#   Open MPI tries every interface, docker bridges included;
# - TCP between hosts, shared memory within one (pml ob1, btl tcp,vader,self);
# - the environment every rank needs (-x): OMP_NUM_THREADS (default: cores of
#   this machine / slots of its line), LOOM_COLLECTIVE_TIMEOUT (the collective
#   watchdog), OPENBLAS_NUM_THREADS, LOOM_VERBOSE, and NCCL_* when set;
# - a host that stops answering ends the job: TCP keepalive on mpirun's
#   channel to its daemons (oob_tcp_keepalive_*), so that after about
#   --keepalive seconds (default 60, LOOM_LAUNCH_KEEPALIVE) without an answer
#   mpirun ("ORTE has lost communication with a remote daemon ... on node X")
#   and the cut-off daemon each end their side of the job. A link that
#   comes back sooner costs nothing (TCP retransmits). Keepalive only
#   probes an idle connection, which mpirun's is while the ranks train;
#   Open MPI's default waits 300 s + 9 x 20 s;
# - a bound on a failed job: once a rank has printed its fatal "[loom rank R]"
#   line, mpirun gets --grace seconds (default 30, LOOM_LAUNCH_GRACE) to end
#   the job, then is stopped, and launch.sh exits 1. mpirun needs this when a
#   host became unreachable and the ranks' watchdog fired first
#   (LOOM_COLLECTIVE_TIMEOUT below --keepalive): mpirun's order to that
#   host's daemon waits unsent, keepalive no longer applies to a connection
#   with data waiting, and mpirun would wait for as long as the link stays
#   down (TCP gives up after ~15 minutes). The ranks on the unreachable host
#   end by their own watchdog; its daemon stays until the link returns.
#
# Under Slurm (--srun), srun starts the ranks and Slurm does the rest of the
# above itself: it knows the hosts, its daemons are already running on them,
# and it notices a node that stops answering (slurmd's heartbeat). What
# launch.sh adds to srun (everything after --srun goes to srun unchanged):
# - --mpi=pmix: each rank finds the others through the PMIx server of its
#   node's slurmstepd, as it does through mpirun's daemons (Debian's Open MPI
#   4.1 is built with PMIx and without Slurm's PMI-2; `srun --mpi=list` and
#   `ompi_info | grep -i pmix` show what a site has; an --mpi= after --srun
#   replaces it);
# - --kill-on-bad-exit=1: one rank failing ends every task of the job;
# - --subnet, pml ob1 and btl tcp,vader,self as OMPI_MCA_* variables: srun
#   carries this environment to every task (--export=ALL, its default), and
#   with it LOOM_COLLECTIVE_TIMEOUT, LOOM_VERBOSE and NCCL_*;
# - OMP_NUM_THREADS, when not set: SLURM_CPUS_PER_TASK (sbatch or salloc -c)
#   or 1; set it beside --cpus-per-task when calling srun from a login node:
#     OMP_NUM_THREADS=8 examples/launch.sh --subnet 10.1.0.0/16 --srun -N 2 \
#       --ntasks-per-node 4 --cpus-per-task 8 build/examples/train_gpt --dp 8 ...
# tests/multihost/slurm.sh starts such a cluster on the test's hosts.
# On a GPU cluster NCCL picks its own network; say which where it guesses
# wrong: NCCL_SOCKET_IFNAME=ib0 (or =^docker,lo) for its bootstrap and TCP
# transport, NCCL_IB_HCA=mlx5_0,mlx5_1 for InfiniBand adapters, NCCL_IB_DISABLE=1
# to force TCP, NCCL_DEBUG=INFO to see what it chose. launch.sh passes every
# NCCL_* variable that is set.
#
# Options (before -np): --hostfile FILE, --subnet CIDR, --startup SECONDS, --keepalive SECONDS,
# --grace SECONDS; or --subnet CIDR --srun SRUN_ARGS...
# LOOM_LAUNCH_AGENT replaces ssh (tests/multihost/on_host.sh enters a network
# namespace). Everything from -np on goes to mpirun unchanged.
set -uo pipefail

hostfile="" subnet="" grace=${LOOM_LAUNCH_GRACE:-30} keepalive=${LOOM_LAUNCH_KEEPALIVE:-60}
startup=${LOOM_LAUNCH_STARTUP:-120} srun=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) hostfile=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --srun) srun=1; shift; break ;;
    --grace) grace=$2; shift 2 ;;
    --keepalive) keepalive=$2; shift 2 ;;
    --startup) startup=$2; shift 2 ;;
    *) break ;;
  esac
done
fail() { echo "launch.sh: $*" >&2; exit 1; }

if [ "$srun" = 1 ]; then
  command -v srun > /dev/null || fail "--srun: srun is not installed here (Slurm's client commands)"
  [ -z "$hostfile" ] || fail "--srun takes no --hostfile: Slurm chooses the hosts (srun -w h1,h2 names them)"
  [ $# -gt 0 ] || fail "nothing to run: give srun's arguments, e.g. --srun -N 2 -n 8 build/examples/train_gpt --dp 8"
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,vader,self
  [ -n "$subnet" ] && export OMPI_MCA_btl_tcp_if_include="$subnet"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
  export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
  exec srun --mpi=pmix --kill-on-bad-exit=1 "$@"
fi
[ -n "$hostfile" ] || fail "--hostfile FILE is required (one host a line: 'node1 slots=4')"
[ -r "$hostfile" ] || fail "cannot read the hostfile '$hostfile'"
[[ "$grace" =~ ^[0-9]+$ ]] && [ "$grace" -ge 1 ] || fail "--grace must be a whole number of seconds >= 1, got '$grace'"
[[ "$startup" =~ ^[0-9]+$ ]] && [ "$startup" -ge 1 ] || fail "--startup must be a whole number of seconds >= 1, got '$startup'"
[[ "$keepalive" =~ ^[0-9]+$ ]] && [ "$keepalive" -ge 8 ] ||
  fail "--keepalive must be a whole number of seconds >= 8, got '$keepalive'"
[ $# -gt 0 ] || fail "nothing to run: give mpirun's arguments, e.g. -np 4 build/examples/train_gpt --dp 4"

agent=${LOOM_LAUNCH_AGENT:-ssh -o BatchMode=yes -o ConnectTimeout=10}

# Every host answers, or nothing starts.
hosts=() slots=0
while read -r host rest; do
  [[ -z "$host" || "$host" == \#* ]] && continue
  hosts+=("$host")
  s=$(sed -n 's/.*slots=\([0-9]*\).*/\1/p' <<<"$rest")
  slots=$((slots + ${s:-1}))
done < "$hostfile"
[ ${#hosts[@]} -gt 0 ] || fail "the hostfile '$hostfile' names no host"
for host in "${hosts[@]}"; do
  if ! out=$(timeout 15 $agent "$host" true 2>&1); then
    fail "host '$host' (hostfile $hostfile) does not answer: ${out:-no answer within 15 s}"
  fi
done

mca=(--mca pml ob1 --mca btl tcp,vader,self --mca plm_rsh_no_tree_spawn 1)
# Idle for half of it, then 4 probes over the other half.
mca+=(--mca oob_tcp_keepalive_time $((keepalive / 2)) --mca oob_tcp_keepalive_intvl $((keepalive / 8))
      --mca oob_tcp_keepalive_probes 4)
[ -n "${LOOM_LAUNCH_AGENT:-}" ] && mca+=(--mca plm_rsh_agent "$LOOM_LAUNCH_AGENT")
[ -n "$subnet" ] && mca+=(--mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet")
[ "$(id -u)" -eq 0 ] && mca+=(--allow-run-as-root)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) * ${#hosts[@]} / slots > 0 ? $(nproc) * ${#hosts[@]} / slots : 1 ))}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
env_args=(-x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
for v in LOOM_COLLECTIVE_TIMEOUT LOOM_VERBOSE $(compgen -e | grep '^NCCL_'); do
  [ -n "${!v+x}" ] && env_args+=(-x "$v")
done

# mpirun's output goes through two readers: stdout's notes when the job map
# is printed (--display-map: every daemon has called back, the ranks start),
# stderr's notes the first fatal loom line.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkfifo "$work/stdout" "$work/stderr"
mpirun --hostfile "$hostfile" --display-map "${mca[@]}" "${env_args[@]}" "$@" > "$work/stdout" 2> "$work/stderr" &
mpirun_pid=$!
while IFS= read -r line; do
  printf '%s\n' "$line"
  if [[ "$line" == *"JOB MAP"* ]]; then touch "$work/started"; fi
done < "$work/stdout" &
while IFS= read -r line; do
  printf '%s\n' "$line" >&2
  if [[ "$line" == *"[loom rank "* && ! -e "$work/failed" ]]; then date +%s > "$work/failed"; fi
done < "$work/stderr" &

stop_mpirun() {
  kill -TERM "$mpirun_pid" 2> /dev/null
  sleep 2
  kill -KILL "$mpirun_pid" 2> /dev/null
  wait "$mpirun_pid" 2> /dev/null
  exit 1
}
# Which hosts cannot open a TCP connection to this one on --subnet: a
# connection refused on port 9 is an answer, silence or "no route" is not.
unreachable_hosts() {
  local here_addr host bad=""
  here_addr=$(ip -o -4 addr show to "$subnet" 2> /dev/null | awk '{print $4}' | cut -d/ -f1 | head -n 1)
  [ -n "$here_addr" ] || { echo "(this host has no address on $subnet)"; return; }
  for host in "${hosts[@]}"; do
    out=$(timeout 10 $agent "$host" "timeout 3 bash -c '</dev/tcp/$here_addr/9'" 2>&1)
    [[ "$out" == *"Connection refused"* ]] || bad+=" '$host'"
  done
  echo "${bad:- (none found: every host reaches $here_addr)}"
}
t_start=$(date +%s)
while kill -0 "$mpirun_pid" 2> /dev/null; do
  if [ ! -e "$work/started" ] && [ $(($(date +%s) - t_start)) -ge "$startup" ]; then
    msg="launch.sh: mpirun's daemons did not all call back within $startup s (--startup)"
    if [ -n "$subnet" ]; then msg+="; hosts that cannot reach this one on $subnet:$(unreachable_hosts)"; fi
    echo "$msg. Stopping mpirun." >&2
    stop_mpirun
  fi
  if [ -e "$work/failed" ] && [ $(($(date +%s) - $(cat "$work/failed"))) -ge "$grace" ]; then
    echo "launch.sh: a rank failed $grace s ago and mpirun is still waiting (for a host it cannot reach?):" \
         "stopping it. Ranks on an unreachable host end by their own collective watchdog." >&2
    stop_mpirun
  fi
  sleep 1
done
wait "$mpirun_pid"
rc=$?
wait
exit $rc
