#!/usr/bin/env bash
# mpirun.sh ARGS...: `mpirun ARGS...` as a user logged in on h0 would type it,
# with hosts.sh's hostfile and the MCA parameters a multi-host run needs:
#   plm_rsh_agent         how mpirun reaches the other hosts (ssh on a
#                         cluster; on_host.sh here), one daemon per host
#   btl_tcp_if_include,   MPI's traffic and mpirun's own out-of-band channel
#   oob_tcp_if_include    only on the hosts' subnet (a cluster's: its fast network)
#   pml ob1, btl tcp,vader,self: TCP between hosts, shared memory within one
# and examples/launch.sh's environment and supervision of a failed job.
here=$(cd "$(dirname "$0")" && pwd)
: "${LOOM_MH_DIR:?mpirun.sh runs inside hosts.sh}"
export LOOM_LAUNCH_AGENT="$here/on_host.sh"
exec "$here/on_host.sh" h0 "$(printf '%q ' "$here/../../examples/launch.sh" --hostfile "$LOOM_MH_DIR/hostfile" \
  --subnet 192.0.2.0/24 "$@")"
