#!/usr/bin/env bash
# A one-host Slurm cluster for the Slurm tests: installs Debian's slurm-wlm and munge (when
# missing), writes a slurm.conf for this host (partition `debug`, this machine's CPUs and
# most of its memory), and starts munged, slurmctld and slurmd (when not running). Safe to
# run again: each step is skipped when already done. Needs root.
#
#   bash scripts/slurm_one_host.sh          # install, configure, start; wait until the node is idle
#   bash scripts/slurm_one_host.sh --check  # exit 0 when the cluster answers, 1 otherwise
set -euo pipefail

conf=/etc/slurm/slurm.conf
host=$(hostname -s)

cluster_answers() {
    command -v sinfo >/dev/null 2>&1 &&
        sinfo -h -N -o '%N %t' 2>/dev/null | grep -Eq "^$host (idle|mix|alloc)"
}

if [ "${1:-}" = "--check" ]; then
    cluster_answers
    exit $?
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_one_host.sh: run as root (it installs packages and starts daemons)" >&2
    exit 1
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm munge >/dev/null
fi

# munge: a key, its run directory, and the daemon (as the munge user, as its service does).
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
fi

# slurm.conf: one node, this host; the daemons run as root, processes tracked by their
# parent pids (no cgroups needed), no accounting database.
cpus=$(nproc)
memory_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
wanted=$(cat <<EOF
# Written by workbench's scripts/slurm_one_host.sh: a one-host cluster for its tests.
ClusterName=workbench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
KillWait=30
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
restart=0
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$wanted" ]; then
    printf '%s\n' "$wanted" >"$conf"
    restart=1
fi

daemon_running() { # name pidfile
    [ -s "$2" ] && kill -0 "$(cat "$2")" 2>/dev/null
}
for daemon in slurmctld slurmd; do
    pidfile=/run/$daemon.pid
    if [ "$restart" = 1 ] && daemon_running "$daemon" "$pidfile"; then
        kill "$(cat "$pidfile")"
        sleep 1
    fi
    if ! daemon_running "$daemon" "$pidfile"; then
        "/usr/sbin/$daemon"
    fi
done

for _ in $(seq 60); do
    if cluster_answers; then
        exit 0
    fi
    # A node that was down (a restart of this script) comes back when told.
    scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    sleep 1
done
echo "slurm_one_host.sh: node $host did not become idle; see /var/log/slurm/" >&2
sinfo -N >&2 || true
exit 1
