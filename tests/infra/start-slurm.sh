#!/usr/bin/env bash
# Start a single-node Slurm "cluster" on this machine for the slurm tests, with 4 fake GPUs.
#
# Idempotent: does nothing when `sinfo` already shows the node idle/mixed/allocated. Installs
# nothing (CI installs slurm-wlm). Needs root and no systemd. It writes (only if absent or written
# by this script before; a foreign slurm.conf is left alone and the script fails):
#   $SLURM_CONF_DIR/slurm.conf, gres.conf     (default /etc/slurm)
#   $SLURM_STATE/fakegpu0..3                   placeholder device nodes (c 1:3) for gres.conf
#   $SLURM_STATE/{ctld,d}/                     state and spool folders, logs in $SLURM_STATE/log
# then starts munged (as munge), slurmctld and slurmd, resumes the node and waits (up to 60 s)
# until `sinfo` shows it ready.
#
# The node is "localhost" with this machine's CPU count; the GPUs are placeholder nodes, so
# `--gres=gpu:N` jobs get CUDA_VISIBLE_DEVICES from Slurm but no real device.
set -euo pipefail

conf_dir=${SLURM_CONF_DIR:-/etc/slurm}
state=${SLURM_STATE:-/var/lib/orchestrate-slurm}
marker="# written by orchestrate tests/infra/start-slurm.sh"

say() { echo "start-slurm: $*"; }

# A live (not zombie) process with exactly this name, of this cluster: the two-node cluster's
# daemons (start-slurm-multinode.sh) run with `-f its/slurm.conf` and are not this one's (taking
# them for it left this cluster down and the script waiting for a node that never came).
running() {
    local pid
    for pid in $(pgrep -x "$1" 2>/dev/null); do
        case "$(ps -o args= -p "$pid" 2>/dev/null)" in *" -f "*) continue ;; esac
        case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*|"") ;; *) return 0 ;; esac
    done
    return 1
}

node_ready() {
    local s
    s=$(sinfo -h -n localhost -o %T 2>/dev/null | head -n1) || return 1
    case "$s" in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac
}

for tool in munged slurmctld slurmd sinfo scontrol sbatch; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        say "$tool not found: apt-get install -y slurm-wlm" >&2
        exit 1
    fi
done

if running slurmctld && running slurmd && node_ready; then
    say "slurm already running: $(sinfo -h -o '%P %D %T %G' | head -n1)"
    exit 0
fi

# --- configuration --------------------------------------------------------------------------
mkdir -p "$conf_dir" "$state/ctld" "$state/d" "$state/log"
if [ -f "$conf_dir/slurm.conf" ] && ! grep -qF "$marker" "$conf_dir/slurm.conf"; then
    say "$conf_dir/slurm.conf exists and was not written by this script; not touching it" >&2
    exit 1
fi
# slurmd wants character devices: nodes with /dev/null's numbers (1:3) stand in for GPUs.
for i in 0 1 2 3; do
    f="$state/fakegpu$i"
    [ -c "$f" ] || { rm -f "$f"; mknod -m 0666 "$f" c 1 3; }
done
cpus=$(nproc)
mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)

cat >"$conf_dir/slurm.conf.new" <<EOF
$marker
ClusterName=orchestrate-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# cancelled / timed-out jobs get SIGKILL 5 s after SIGTERM (default 30 s)
KillWait=5
MinJobAge=300
InactiveLimit=0
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$conf_dir/gres.conf.new" <<EOF
$marker
# Placeholder device nodes: a count-only line makes slurmd report 0 GPUs and the node drains,
# and plain files are not counted as devices (no CUDA_VISIBLE_DEVICES).
NodeName=localhost Name=gpu File=$state/fakegpu[0-3]
EOF
mv "$conf_dir/slurm.conf.new" "$conf_dir/slurm.conf"
mv "$conf_dir/gres.conf.new" "$conf_dir/gres.conf"
say "wrote $conf_dir/slurm.conf and gres.conf (node localhost: $cpus CPUs, 4 fake GPUs)"

# --- daemons --------------------------------------------------------------------------------
if ! running munged; then
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chmod 0755 /run/munge
    su -s /bin/sh munge -c /usr/sbin/munged
    say "started munged"
else
    say "munged already running"
fi

if ! running slurmctld; then
    /usr/sbin/slurmctld
    say "started slurmctld (log: $state/log/slurmctld.log)"
else
    scontrol reconfigure >/dev/null 2>&1 || true
    say "slurmctld already running"
fi

if ! running slurmd; then
    /usr/sbin/slurmd -N localhost
    say "started slurmd (log: $state/log/slurmd.log)"
else
    say "slurmd already running"
fi

# --- wait until the node takes jobs ---------------------------------------------------------
for _ in $(seq 1 60); do
    if node_ready; then
        say "ready: $(sinfo -h -o '%P %D %T %G' | head -n1)"
        exit 0
    fi
    s=$(sinfo -h -n localhost -o %T 2>/dev/null | head -n1 || true)
    case "$s" in
        drain*|down*|unknown*|"") scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
say "the node did not become ready within 60 s:" >&2
sinfo -N -l >&2 || true
scontrol show node localhost >&2 || true
tail -n 20 "$state/log/slurmctld.log" "$state/log/slurmd.log" >&2 || true
exit 1
