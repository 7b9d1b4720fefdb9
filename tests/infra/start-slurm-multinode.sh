#!/usr/bin/env bash
# Start a multi-node Slurm cluster on this machine, beside the single-node one of start-slurm.sh:
# its own cluster name, config folder, ports, state and spool folders, with accounting (sacct).
#
#   cluster  orchestrate-mn            clients pick it with SLURM_CONF=$conf_dir/slurm.conf
#   nodes    mn1, mn2 (MN_NODES)       each slurmd in a network namespace of its own (its own
#                                       address, 10.250.26.1N) and a UTS namespace (its own
#                                       hostname), 4 CPUs and 4 fake GPUs each
#   network  a bridge inside a namespace of its own ("osl-sw"); this machine is 10.250.26.1 on it.
#            Only this script's namespaces and that one address are on it: test traffic stays
#            between them (the host's own firewall is not involved: its FORWARD chain never sees
#            the nodes' traffic, and nothing is added to it).
#   ports    slurmctld 6917, slurmd 6918 (in each node's namespace), slurmdbd 6919,
#            MariaDB 127.0.0.1:13306 (its own data folder; slurmdbd's storage)
#   partitions  batch (default, preemptable: PreemptMode=REQUEUE) and urgent (higher
#            PriorityTier: its jobs preempt batch jobs), both over every node
#
# The nodes share this machine's filesystem (the usual cluster setup: /work, the results, the
# venv); their /etc/hosts (/etc/netns/NAME/hosts, bound over it in their mount namespace) names every node, so torchrun's
# rendezvous and gloo find each other by node name.
#
# Idempotent: when every daemon answers and the nodes are idle, it only says so. Needs root,
# iproute2, util-linux (unshare), slurm-wlm, slurmdbd and mariadb-server (.ci/run installs them).
#   --stop    stop this cluster's daemons and remove its namespaces (state is kept)
#   --status  exit 0 when it is up, 1 otherwise (no changes)
set -euo pipefail

cluster=orchestrate-mn
conf_dir=${MN_CONF_DIR:-/etc/orchestrate-slurm-mn}
state=${MN_STATE:-/var/lib/orchestrate-slurm-mn}
nodes=${MN_NODES:-2}
subnet=10.250.26
ctld_port=6917
slurmd_port=6918
dbd_port=6919
db_port=13306
marker="# written by orchestrate tests/infra/start-slurm-multinode.sh"
export SLURM_CONF=$conf_dir/slurm.conf

say() { echo "start-slurm-multinode: $*"; }
node_name() { echo "mn$1"; }
node_ns() { echo "osl-mn$1"; }

# A pid file's process, alive and not a zombie.
alive() {
    local pid
    [ -f "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] || return 1
    case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*|"") return 1 ;; *) return 0 ;; esac
}

# Every node idle/mixed/allocated/completing (none down, drained or unknown).
nodes_ready() {
    local states
    states=$(sinfo -h -N -p batch -o %T 2>/dev/null) || return 1
    [ "$(echo "$states" | grep -c .)" -eq "$nodes" ] || return 1
    ! echo "$states" | grep -qvE '^(idle|mixed|allocated|completing)$'
}

up() {
    alive "$state/mariadb.pid" && alive "$state/slurmdbd.pid" && alive "$state/slurmctld.pid" \
        || return 1
    local i
    for i in $(seq 1 "$nodes"); do alive "$state/slurmd-$(node_name "$i").pid" || return 1; done
    nodes_ready
}

stop_pidfile() {
    local pid
    alive "$1" || return 0
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$1" || return 0; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
}

if [ "${1:-}" = "--status" ]; then
    up && { say "up: $(sinfo -h -o '%P %D %T %G' | tr '\n' ' ')"; exit 0; }
    say "not up"; exit 1
fi

if [ "${1:-}" = "--stop" ]; then
    for i in $(seq 1 "$nodes"); do stop_pidfile "$state/slurmd-$(node_name "$i").pid"; done
    stop_pidfile "$state/slurmctld.pid"
    stop_pidfile "$state/slurmdbd.pid"
    stop_pidfile "$state/mariadb.pid"
    for i in $(seq 1 "$nodes"); do ip netns del "$(node_ns "$i")" 2>/dev/null || true; done
    ip netns del osl-sw 2>/dev/null || true
    ip link del osl-host 2>/dev/null || true
    say "stopped (state kept in $state)"
    exit 0
fi

for tool in munged slurmctld slurmd slurmdbd mariadbd mariadb-install-db sinfo sacctmgr ip unshare nsenter; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        say "$tool not found: apt-get install -y slurm-wlm slurmdbd mariadb-server iproute2" >&2
        exit 1
    fi
done

if up; then
    say "already running: $(sinfo -h -o '%P %D %T %G' | tr '\n' ' ')"
    exit 0
fi

# --- configuration --------------------------------------------------------------------------
mkdir -p "$conf_dir" "$state/ctld" "$state/log" "$state/d"
if [ -f "$conf_dir/slurm.conf" ] && ! grep -qF "$marker" "$conf_dir/slurm.conf"; then
    say "$conf_dir/slurm.conf exists and was not written by this script; not touching it" >&2
    exit 1
fi
names=()
for i in $(seq 1 "$nodes"); do
    n=$(node_name "$i")
    names+=("$n")
    mkdir -p "$state/d/$n" "$state/gpu/$n"
    # slurmd wants character devices: nodes with /dev/null's numbers (1:3) stand in for GPUs.
    for g in 0 1 2 3; do
        f="$state/gpu/$n/fakegpu$g"
        [ -c "$f" ] || { rm -f "$f"; mknod -m 0666 "$f" c 1 3; }
    done
done
node_list="mn[1-$nodes]"

{
    echo "$marker"
    cat <<EOF
ClusterName=$cluster
SlurmctldHost=localhost($subnet.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
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
# The nodes are namespaces of a 2-core machine: take the CPUs configured here as given.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
# Accounting in slurmdbd (sacct: state, elapsed, node list, exit code of every job)
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# Preemption: jobs of partition urgent (higher PriorityTier) preempt those of batch by requeue
# (or cancel, for jobs that may not be requeued: orchestrate submits with --no-requeue)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# cancelled / timed-out jobs get SIGKILL 5 s after SIGTERM (default 30 s)
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmdTimeout=30
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d/%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
EOF
    for i in $(seq 1 "$nodes"); do
        echo "NodeName=$(node_name "$i") NodeAddr=$subnet.1$i CPUs=4 RealMemory=2000 Gres=gpu:4 State=UNKNOWN"
    done
    echo "PartitionName=batch Nodes=$node_list Default=YES MaxTime=INFINITE State=UP PriorityTier=1"
    echo "PartitionName=urgent Nodes=$node_list MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
} >"$conf_dir/slurm.conf.new"
{
    echo "$marker"
    echo "# Placeholder device nodes (a count-only line makes slurmd report 0 GPUs)."
    for n in "${names[@]}"; do echo "NodeName=$n Name=gpu File=$state/gpu/$n/fakegpu[0-3]"; done
} >"$conf_dir/gres.conf.new"
cat >"$conf_dir/slurmdbd.conf.new" <<EOF
$marker
AuthType=auth/munge
DbdHost=localhost
DbdPort=$dbd_port
SlurmUser=root
PidFile=$state/slurmdbd.pid
LogFile=$state/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StorageLoc=orchestrate_mn_acct
EOF
cat >"$conf_dir/my.cnf" <<EOF
$marker
[mariadbd]
datadir=$state/mysql
socket=$state/mysqld.sock
pid-file=$state/mariadb.pid
port=$db_port
bind-address=127.0.0.1
log-error=$state/log/mariadb.log
innodb_buffer_pool_size=16M
innodb_log_file_size=8M
performance_schema=OFF
skip-name-resolve
EOF
chmod 600 "$conf_dir/slurmdbd.conf.new"
mv "$conf_dir/slurm.conf.new" "$conf_dir/slurm.conf"
mv "$conf_dir/gres.conf.new" "$conf_dir/gres.conf"
mv "$conf_dir/slurmdbd.conf.new" "$conf_dir/slurmdbd.conf"
say "wrote $conf_dir/{slurm,gres,slurmdbd}.conf and my.cnf ($nodes nodes: ${names[*]})"

# --- network: a bridge in namespace osl-sw, one namespace per node ----------------------------
if ! ip netns list | grep -qw osl-sw; then
    ip netns add osl-sw
    ip -n osl-sw link set dev lo up
    ip -n osl-sw link add osl-br type bridge
    ip -n osl-sw link set dev osl-br up
fi
if ! ip link show dev osl-host >/dev/null 2>&1; then
    ip link add osl-host type veth peer name osl-sw-host netns osl-sw
    ip -n osl-sw link set dev osl-sw-host master osl-br
    ip -n osl-sw link set dev osl-sw-host up
    ip addr add "$subnet.1/24" dev osl-host
    ip link set dev osl-host up
fi
for i in $(seq 1 "$nodes"); do
    ns=$(node_ns "$i")
    if ! ip netns list | grep -qw "$ns"; then
        ip netns add "$ns"
        ip -n "$ns" link set dev lo up
        ip -n osl-sw link add "osl-sw-n$i" type veth peer name eth0 netns "$ns"
        ip -n osl-sw link set dev "osl-sw-n$i" master osl-br
        ip -n osl-sw link set dev "osl-sw-n$i" up
        ip -n "$ns" addr add "$subnet.1$i/24" dev eth0
        ip -n "$ns" link set dev eth0 up
    fi
    # mounted over /etc/hosts in the node's mount namespace (as `ip netns exec` would)
    mkdir -p "/etc/netns/$ns"
    {
        echo "127.0.0.1 localhost"
        echo "$subnet.1 orchestrate-mn-ctl"
        for j in $(seq 1 "$nodes"); do echo "$subnet.1$j $(node_name "$j")"; done
    } >"/etc/netns/$ns/hosts"
done

# --- daemons --------------------------------------------------------------------------------
if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge
    chown munge:munge /run/munge
    chmod 0755 /run/munge
    su -s /bin/sh munge -c /usr/sbin/munged
    say "started munged"
fi

if ! alive "$state/mariadb.pid"; then
    if [ ! -d "$state/mysql/mysql" ]; then
        mkdir -p "$state/mysql"
        chown mysql:mysql "$state/mysql"
        mariadb-install-db --defaults-file="$conf_dir/my.cnf" --user=mysql \
            --auth-root-authentication-method=socket >"$state/log/mariadb-install.log" 2>&1
    fi
    chown mysql:mysql "$state" 2>/dev/null || true
    # mariadbd does not daemonize itself: run it in the background, its own session
    setsid mariadbd --defaults-file="$conf_dir/my.cnf" --user=mysql </dev/null \
        >>"$state/log/mariadb.log" 2>&1 &
    for _ in $(seq 1 60); do
        mariadb --socket="$state/mysqld.sock" -u root -e "SELECT 1" >/dev/null 2>&1 && break
        sleep 0.5
    done
    mariadb --socket="$state/mysqld.sock" -u root <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1';
GRANT ALL ON orchestrate_mn_acct.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF
    say "started mariadb (127.0.0.1:$db_port, data in $state/mysql)"
fi

if ! alive "$state/slurmdbd.pid"; then
    slurmdbd  # reads slurmdbd.conf beside $SLURM_CONF
    for _ in $(seq 1 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
    say "started slurmdbd (port $dbd_port)"
fi
if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$cluster"; then
    sacctmgr -i add cluster "$cluster" >/dev/null
    say "registered cluster $cluster in slurmdbd"
fi

if ! alive "$state/slurmctld.pid"; then
    slurmctld -f "$conf_dir/slurm.conf"
    say "started slurmctld (port $ctld_port, log $state/log/slurmctld.log)"
else
    scontrol reconfigure >/dev/null 2>&1 || true
fi

for i in $(seq 1 "$nodes"); do
    n=$(node_name "$i")
    ns=$(node_ns "$i")
    if ! alive "$state/slurmd-$n.pid"; then
        # Its own network (address), UTS (hostname) and mount namespaces (its /etc/hosts;
        # mounts of this machine still reach it); slurmd daemonizes in them. Not `ip netns
        # exec`: that mounts a fresh /sys, without the cgroup tree slurmd wants.
        nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation slave sh -c \
            'mount --bind "$3" /etc/hosts && hostname "$1" && exec /usr/sbin/slurmd -f "$2" -N "$1"' \
            sh "$n" "$SLURM_CONF" "/etc/netns/$ns/hosts"
        say "started slurmd $n in namespace $ns ($subnet.1$i)"
    fi
done

# --- wait until the nodes take jobs ---------------------------------------------------------
for _ in $(seq 1 90); do
    if nodes_ready; then
        say "ready: $(sinfo -h -o '%P %D %T %G' | tr '\n' ' ')(SLURM_CONF=$SLURM_CONF)"
        exit 0
    fi
    for n in "${names[@]}"; do
        s=$(sinfo -h -n "$n" -o %T 2>/dev/null | head -n1 || true)
        case "$s" in
            drain*|down*|unknown*|"") scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true ;;
        esac
    done
    sleep 1
done
say "the nodes did not become ready within 90 s:" >&2
sinfo -N -l >&2 || true
tail -n 20 "$state/log/slurmctld.log" "$state"/log/slurmd-*.log >&2 || true
exit 1
