#!/usr/bin/env bash
# on_host.sh HOST COMMAND: runs the shell command line COMMAND on HOST (one of
# hosts.sh's namespaces), as ssh would: HOST's network, its own hostname (a
# UTS namespace), its own clock, and /etc/hosts naming every host. Also Open MPI's rsh agent
# (--mca plm_rsh_agent), which calls it as `on_host.sh HOST orted ...`.
# Exit code 255 and a message, like ssh, when HOST does not exist.
host=$1
shift
ns="${LOOM_MH_PREFIX:?on_host.sh runs inside hosts.sh}$host"
if ! ip netns list | grep -qw "^$ns"; then
  echo "on_host.sh: ssh: Could not resolve hostname $host: no such host" >&2
  exit 255
fi
# ip netns exec gives the command a mount namespace of its own, so the bind
# mount of /etc/hosts stays inside it. Each host gets its own clock too, as
# machines have: a time namespace whose CLOCK_MONOTONIC runs 1000 s ahead
# per host number (h1: +1000 s), so a trace from several hosts must align them.
# (Without time namespaces, LOOM_MH_CLOCKS=0, the hosts share the clock.)
clock=()
[ "${LOOM_MH_CLOCKS:-0}" = 1 ] && clock=(-T --monotonic $(( ${host#h} * 1000 )))
exec ip netns exec "$ns" unshare -u "${clock[@]}" sh -c 'hostname "$0" && mount --bind "$LOOM_MH_DIR/hosts" /etc/hosts && exec bash -c "$1"' "$host" "$*"
