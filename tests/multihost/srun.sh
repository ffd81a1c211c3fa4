#!/usr/bin/env bash
# srun.sh -np N PROGRAM ARGS...: N tasks of PROGRAM spread over every host of
# slurm.sh's cluster, as a user logged in on h0 would start them:
#   examples/launch.sh --subnet 192.0.2.0/24 --srun -v -N <hosts> -n N PROGRAM ARGS...
# (-np N, mpirun's spelling, so that tests can swap it for mpirun.sh.) -v:
# srun prints where each task runs ("launching StepId=1.0 on host h1, 1 tasks: 1").
here=$(cd "$(dirname "$0")" && pwd)
: "${LOOM_MH_DIR:?srun.sh runs inside hosts.sh and slurm.sh}" "${SLURM_CONF:?srun.sh runs inside slurm.sh}"
[ "${1:-}" = -np ] || { echo "srun.sh: usage: srun.sh -np N PROGRAM ARGS..." >&2; exit 2; }
tasks=$2
shift 2
hosts=$(grep -c . "$LOOM_MH_DIR/hostfile")
exec "$here/on_host.sh" h0 "$(printf '%q ' "$here/../../examples/launch.sh" --subnet 192.0.2.0/24 --srun -v \
  -N "$hosts" -n "$tasks" "$@")"
