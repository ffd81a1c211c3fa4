#!/usr/bin/env bash
# Several "hosts" on one machine, for the multihost tests: network namespaces
# joined by a bridge, each with its own address, hostname and /etc/hosts.
#
#   hosts.sh N COMMAND...   creates hosts h0 .. h(N-1), runs COMMAND (in the
#                           machine's own namespace) and removes every host
#                           again, however COMMAND ends. Exit code: COMMAND's,
#                           or 77 (skip) where namespaces cannot be made.
#
# COMMAND sees LOOM_MH_DIR (this run's folder: hostfile, hosts, agent log),
# LOOM_MH_PREFIX (the namespaces' name prefix, unique per run, so that ctest -j
# runs do not collide) and LOOM_MH_MPIRUN (mpirun.sh: mpirun from h0, with the
# MCA parameters that keep Open MPI on the hosts' subnet). Helpers for tests:
#   hosts.sh cut  HOST   pull HOST's cable at the switch (its side loses carrier)
#   hosts.sh mend HOST   plug it back in
#   hosts.sh pids HOST   the processes running on HOST
#
# Layout: a switch namespace <prefix>sw holding bridge br0; host i is the
# namespace <prefix>h<i>, with eth0 = 192.0.2.(10+i)/24 (RFC 5737's
# documentation range, routed nowhere) on a veth whose peer p<i> sits on the
# bridge. Nothing is added to the machine's own namespace, and the hosts have
# no route anywhere else: traffic cannot leave them.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)

ns_exists() { ip netns list 2>/dev/null | grep -qw "^$1"; }
host_ns() { echo "${LOOM_MH_PREFIX:?run inside hosts.sh N ...}$1"; }

case "${1:-}" in
  cut)  exec ip -n "${LOOM_MH_PREFIX}sw" link set "p${2#h}" down ;;
  mend) exec ip -n "${LOOM_MH_PREFIX}sw" link set "p${2#h}" up ;;
  pids) exec ip netns pids "$(host_ns "$2")" ;;
esac

n=${1:?usage: hosts.sh N COMMAND...}
shift
if [ "$(id -u)" -ne 0 ]; then echo "hosts.sh: SKIP: network namespaces need root"; exit 77; fi
if ! command -v ip > /dev/null; then
  bash "$here/../../examples/apt_install.sh" iproute2 > /dev/null 2>&1 || true
fi
if ! command -v ip > /dev/null || ! command -v unshare > /dev/null; then
  echo "hosts.sh: SKIP: 'ip' (iproute2) or 'unshare' not available"; exit 77
fi
if ! unshare -u true 2> /dev/null; then echo "hosts.sh: SKIP: unshare -u (a hostname per host) is not permitted here"; exit 77; fi

# Each host its own clock where the kernel has time namespaces (Linux 5.6).
export LOOM_MH_CLOCKS=0
unshare -T --monotonic 1 true 2> /dev/null && LOOM_MH_CLOCKS=1
export LOOM_MH_PREFIX="loom$$x"
export LOOM_MH_DIR
LOOM_MH_DIR=$(mktemp -d /tmp/loom_multihost.XXXXXX)
export LOOM_MH_MPIRUN="$here/mpirun.sh"

down() {
  # Every process still running on a host (a daemon left behind by a cut
  # link), then the namespaces: their veths and the bridge go with them.
  for ((i = 0; i < n; i++)); do
    local ns="${LOOM_MH_PREFIX}h$i"
    ns_exists "$ns" || continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for ((i = 0; i < n; i++)); do ip netns del "${LOOM_MH_PREFIX}h$i" 2>/dev/null; done
  ip netns del "${LOOM_MH_PREFIX}sw" 2>/dev/null
  rm -rf "$LOOM_MH_DIR"
}
trap down EXIT
trap 'exit 130' INT TERM
# A test that overruns its CTest TIMEOUT is killed with SIGKILL, its child
# processes too, and no trap runs; a daemon that has left the process tree
# (slurm.sh's slurmd and slurmctld, munged) would stay, and the hosts with it.
# So a watcher outside the tree (its own session; its parent, a subshell,
# exits at once) removes the hosts once this script is gone, however it went.
watch_over() { while kill -0 "$1" 2> /dev/null; do sleep 1; done; down; }
( trap - EXIT INT TERM; setsid bash -c "$(declare -f ns_exists down watch_over); n=$n; watch_over $$" \
    < /dev/null > /dev/null 2>&1 & )

up() {
  local sw="${LOOM_MH_PREFIX}sw"
  ip netns add "$sw" || return 1
  ip -n "$sw" link add br0 type bridge || return 1
  ip -n "$sw" link set br0 up || return 1
  : > "$LOOM_MH_DIR/hostfile"
  printf '127.0.0.1 localhost\n' > "$LOOM_MH_DIR/hosts"
  for ((i = 0; i < n; i++)); do
    local ns="${LOOM_MH_PREFIX}h$i"
    ip netns add "$ns" || return 1
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$sw" link set "p$i" master br0 up || return 1
    ip -n "$ns" addr add "192.0.2.$((10 + i))/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
    printf '192.0.2.%d h%d\n' $((10 + i)) "$i" >> "$LOOM_MH_DIR/hosts"
    printf 'h%d slots=%d\n' "$i" "${LOOM_MH_SLOTS:-1}" >> "$LOOM_MH_DIR/hostfile"
  done
}
if ! up; then
  echo "hosts.sh: SKIP: could not create network namespaces (a container without CAP_SYS_ADMIN / CAP_NET_ADMIN?)"
  exit 77
fi

"$@"
