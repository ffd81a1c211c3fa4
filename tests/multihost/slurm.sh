#!/usr/bin/env bash
# slurm.sh COMMAND...: a Slurm cluster on hosts.sh's hosts, for the srun test.
# Inside `hosts.sh N`, it starts munged and slurmctld on h0 and a slurmd on
# every host (node h<i> at 192.0.2.(10+i), LOOM_MH_SLOTS CPUs), waits until
# every node is idle, runs COMMAND (in the machine's own namespace) with
# SLURM_CONF and LOOM_MH_SRUN (srun.sh: srun from h0, through
# examples/launch.sh --srun) set, and stops the daemons however COMMAND ends;
# hosts.sh then removes the hosts, anything still running on them, and the
# run's folder (the cluster's configuration, state, logs and key are in it).
#
#   hosts.sh 2 slurm.sh COMMAND...
#
# Exit code: COMMAND's; 77 (skip) where Slurm or munge is not installed (CI
# installs them: .ci/run); 1, with the daemons' logs, where the cluster does
# not come up within 30 s.
#
# A cluster is normally one slurm.conf and one munge key copied to every
# machine. Here the hosts share one file system, so one copy serves all, and
# one munged on h0 (its socket is a path, which every namespace reaches).
# What differs from a cluster's configuration, and why (Debian 12's Slurm
# 22.05, in a container without systemd):
# - AuthType=auth/munge with a key made for the run: 22.05 has no auth/slurm
#   (new in 23.11), and auth/none, which 22.05 still has, is not in recent
#   Slurm; munge is what clusters run.
# - No cgroups: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none. Yet
#   22.05's slurmd will not start without a cgroup plugin ("error: No
#   filesystem mounted on /sys/fs/cgroup", "Unable to initialize cgroup
#   plugin": ip netns exec mounts a fresh /sys, without the cgroup trees), so
#   cgroup.conf names cgroup/v1 at an empty folder of the run, which nothing
#   then uses. Slurm 24.05 and later have CgroupPlugin=disabled for this,
#   which slurm.sh writes there (Debian 13's 24.11; not tried here).
# - TmpFS per node (tmp.%n): Slurm's PMIx plugin makes
#   TmpFS/spmix_appdir_<uid>_<job>.<step> on each node; in the one /tmp that
#   the hosts share, the second node's mkdir fails ("Cannot create directory
#   ...: File exists") and so does the step.
# - Every daemon runs as root, and every path (spool, state, pid and log
#   files) is in the run's folder, so that runs side by side do not meet.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${LOOM_MH_DIR:?slurm.sh runs inside hosts.sh}"
for tool in munged mungekey slurmctld slurmd srun sinfo; do
  if ! command -v "$tool" > /dev/null; then
    echo "slurm.sh: SKIP: '$tool' is not installed (apt-get install slurmd slurmctld slurm-client munge; .ci/run does)"
    exit 77
  fi
done

d="$LOOM_MH_DIR/slurm"
n=$(grep -c . "$LOOM_MH_DIR/hostfile")
slots=${LOOM_MH_SLOTS:-1}
mkdir -p "$d/state" "$d/cgroup"
chmod 755 "$d"  # munged: its socket's folder must be reachable by every user

export SLURM_CONF="$d/slurm.conf"
{
  echo "ClusterName=loom"
  echo "SlurmctldHost=h0(192.0.2.10)"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$d/munge.socket"
  echo "StateSaveLocation=$d/state"
  echo "SlurmdSpoolDir=$d/spool.%n"
  echo "TmpFS=$d/tmp.%n"
  echo "SlurmctldPidFile=$d/slurmctld.pid"
  echo "SlurmdPidFile=$d/slurmd.%n.pid"
  echo "SlurmctldLogFile=$d/slurmctld.log"
  echo "SlurmdLogFile=$d/slurmd.%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "SwitchType=switch/none"
  echo "MpiDefault=none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "SlurmdParameters=config_overrides"  # CPUs= below, whatever the machine has
  echo "ReturnToService=2"
  for ((i = 0; i < n; i++)); do
    echo "NodeName=h$i NodeAddr=192.0.2.$((10 + i)) CPUs=$slots State=UNKNOWN"
  done
  echo "PartitionName=loom Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$SLURM_CONF"
version=$(slurmd -V | awk '{print $2}')  # "slurm-wlm 22.05.8"
if [ "$(printf '%s\n' 24.05 "$version" | sort -V | head -n 1)" = 24.05 ]; then
  echo "CgroupPlugin=disabled" > "$d/cgroup.conf"
else
  printf 'CgroupPlugin=cgroup/v1\nCgroupMountpoint=%s\n' "$d/cgroup" > "$d/cgroup.conf"
fi
for ((i = 0; i < n; i++)); do mkdir -p "$d/spool.h$i" "$d/tmp.h$i"; done

logs() {
  for f in "$d"/*.log; do echo "---- $f (last 20 lines)"; tail -n 20 "$f"; done
}
stop() {
  # slurmctld, every slurmd (their job steps end with them) and munged, by
  # their pid files; hosts.sh kills whatever is left on the hosts.
  local pids=() f
  for f in "$d"/slurmd.*.pid "$d/slurmctld.pid" "$d/munged.pid"; do
    [ -s "$f" ] && pids+=("$(cat "$f")")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2> /dev/null
  for _ in $(seq 50); do kill -0 "${pids[@]}" 2> /dev/null || return 0; sleep 0.1; done
  kill -KILL "${pids[@]}" 2> /dev/null
}
trap stop EXIT
trap 'exit 130' INT TERM
fail() { echo "slurm.sh: $*"; logs; exit 1; }

mungekey --create --keyfile="$d/munge.key" --bits=1024 || fail "mungekey could not make a key"
"$here/on_host.sh" h0 "munged --force --key-file=$d/munge.key --socket=$d/munge.socket --pid-file=$d/munged.pid \
  --log-file=$d/munged.log --seed-file=$d/munged.seed" || fail "munged did not start"
"$here/on_host.sh" h0 "slurmctld -i" || fail "slurmctld did not start"
for ((i = 0; i < n; i++)); do
  "$here/on_host.sh" "h$i" "slurmd -N h$i" || fail "slurmd did not start on h$i"
done

# Every node registered and idle (sinfo asks slurmctld, which only the hosts reach).
idle=0
for _ in $(seq 60); do
  idle=$("$here/on_host.sh" h0 "sinfo -h -N -o '%N %t'" 2> /dev/null | grep -c ' idle$')
  [ "$idle" -eq "$n" ] && break
  sleep 0.5
done
[ "$idle" -eq "$n" ] || fail "$idle of $n nodes idle after 30 s: $("$here/on_host.sh" h0 "sinfo -N" 2>&1)"

export LOOM_MH_SRUN="$here/srun.sh"
"$@"
