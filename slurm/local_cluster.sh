#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for tests and for trying the Slurm executor.
#
#   slurm/local_cluster.sh start    start munged, slurmctld and slurmd; wait until the node is idle
#   slurm/local_cluster.sh status   show daemons and sinfo; exit 0 only when the node takes jobs
#   slurm/local_cluster.sh stop     cancel this cluster's jobs, stop its daemons, remove its files
#                                   (the job-id counter is kept so job ids never repeat between
#                                   runs; `stop --purge` removes it too)
#
# Needs root and Debian's packages: apt-get install slurm-wlm munge
# No cgroups (proctrack/linuxproc, task/none), so it also runs in containers.
# Environment knobs:
#   COUNTERAUDIT_SLURM_DIR   where config, state and logs live (default /var/spool/counteraudit-slurm)
#   COUNTERAUDIT_SLURM_PORT  slurmctld port (default 6817; slurmd uses the next one)
#   COUNTERAUDIT_SLURM_WAIT  seconds to wait for the node to become idle (default 60)
set -euo pipefail

SLURM_DIR="${COUNTERAUDIT_SLURM_DIR:-/var/spool/counteraudit-slurm}"
CTLD_PORT="${COUNTERAUDIT_SLURM_PORT:-6817}"
SLURMD_PORT="$((CTLD_PORT + 1))"
WAIT_SECONDS="${COUNTERAUDIT_SLURM_WAIT:-60}"

CONF="$SLURM_DIR/slurm.conf"
STATE_DIR="$SLURM_DIR/state"      # slurmctld StateSaveLocation: job-id counter, queued jobs
SPOOL_DIR="$SLURM_DIR/slurmd"     # slurmd spool: batch scripts of running jobs
LOG_DIR="$SLURM_DIR/log"
RUN_DIR="$SLURM_DIR/run"          # pid files
SYSTEM_CONF=/etc/slurm/slurm.conf # where Slurm's commands look when SLURM_CONF is unset
MUNGE_SOCKET=/run/munge/munge.socket.2
SECOND_PARTITION=long

# Every Slurm command below talks to this cluster, whatever the caller's environment says.
export SLURM_CONF="$CONF"

say() { echo "local_cluster: $*"; }
fail() {
    echo "local_cluster: ERROR: $*" >&2
    exit 1
}

show_log_tail() { # file: why the last start failed is usually in its last lines
    if [[ -s "$1" ]]; then
        echo "---- last lines of $1 ----" >&2
        tail -n 25 "$1" >&2
        echo "----" >&2
    fi
}

pid_alive() { # pidfile
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

require_root() {
    [[ "$(id -u)" == 0 ]] || fail "must run as root (it starts munged and slurmd, which switch to job users): sudo $0 $*"
}

require_packages() {
    local missing=()
    for binary in munged munge unmunge slurmctld slurmd sinfo scontrol squeue sbatch srun scancel; do
        command -v "$binary" >/dev/null 2>&1 || missing+=("$binary")
    done
    ((${#missing[@]} == 0)) || fail "missing programs: ${missing[*]}; install them with: apt-get install -y slurm-wlm munge"
}

node_name() {
    slurmd -C | sed -n 's/^NodeName=\([^ ]*\).*/\1/p'
}

# Node state as sinfo prints it (idle, mix, alloc, down*, drain, ...); empty if unreachable.
node_state() {
    timeout 10 sinfo -h -N -n "$(node_name)" -o %t 2>/dev/null | head -n 1 || true
}

node_takes_jobs() {
    case "$(node_state)" in
        idle | mix | alloc | comp) return 0 ;;
        *) return 1 ;;
    esac
}

munge_works() {
    munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1
}

start_munge() {
    if munge_works; then
        say "munged already running (reused)"
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown munge:munge /run/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    # munged refuses to run as root without --force; run it as its own user like the Debian service.
    runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file=/run/munge/munged.pid \
        --log-file=/var/log/munge/munged.log ||
        {
            show_log_tail /var/log/munge/munged.log
            fail "munged did not start (see above)"
        }
    touch "$RUN_DIR/munged.started-here" # stop only a munged this script started
    for _ in $(seq 20); do
        munge_works && {
            say "munged started"
            return
        }
        sleep 0.5
    done
    show_log_tail /var/log/munge/munged.log
    fail "munged started but 'munge -n | unmunge' fails (see above)"
}

write_config() {
    local node_line node memory_mb
    # slurmd -C reports this machine's real sockets/cores/threads/memory; the node must not
    # claim more than it has or slurmctld drains it, so memory is rounded down by 5%.
    node_line="$(slurmd -C | head -n 1)"
    node="$(node_name)"
    [[ -n "$node" ]] || fail "'slurmd -C' printed no NodeName: $node_line"
    memory_mb="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")"
    memory_mb=$((memory_mb * 95 / 100))
    node_line="$(sed "s/RealMemory=[0-9]*/RealMemory=$memory_mb/" <<<"$node_line")"

    cat >"$CONF.tmp" <<EOF
# Generated by slurm/local_cluster.sh on $(date -Is); regenerated at every start.
ClusterName=counteraudit-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire seconds before it may start again (default 120 s): keep
# requeue tests quick. Credentials live long enough for a local job step to launch.
AuthInfo=cred_expire=10
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups: works inside containers; processes are tracked through /proc.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none

# Cores are consumable so several array tasks share the node; memory is only checked
# against the node's size, not reserved, so jobs without --mem still run side by side.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Look at pending jobs every 2 s (default 60/30 s), e.g. a requeued job whose delay is over.
SchedulerParameters=sched_interval=2,bf_interval=2

# Requeue (scontrol requeue, submitit's preemption/timeout handling) must be allowed.
JobRequeue=1
ReturnToService=2
# Short timers: a test cluster should react in seconds, not minutes.
KillWait=2
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10

$node_line NodeAddr=127.0.0.1 NodeHostname=$node State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
PartitionName=$SECOND_PARTITION Nodes=$node Default=NO MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

# Slurm's commands read /etc/slurm/slurm.conf unless SLURM_CONF is set; point it at this
# cluster so plain `sinfo`/`sbatch` (and submitit) work, but never replace someone's config.
install_system_conf_link() {
    if [[ -L "$SYSTEM_CONF" && "$(readlink "$SYSTEM_CONF")" == "$CONF" ]]; then
        return
    fi
    if [[ -e "$SYSTEM_CONF" || -L "$SYSTEM_CONF" ]]; then
        say "kept the existing $SYSTEM_CONF; to use this cluster run: export SLURM_CONF=$CONF"
        return
    fi
    mkdir -p "$(dirname "$SYSTEM_CONF")"
    ln -s "$CONF" "$SYSTEM_CONF"
    say "linked $SYSTEM_CONF -> $CONF"
}

remove_system_conf_link() {
    if [[ -L "$SYSTEM_CONF" && "$(readlink "$SYSTEM_CONF")" == "$CONF" ]]; then
        rm -f "$SYSTEM_CONF"
    fi
}

stop_daemon() { # name pidfile
    local pidfile="$2" pid
    pid_alive "$pidfile" || {
        rm -f "$pidfile"
        return 0
    }
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "$1 (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    say "stopped $1 (pid $pid)"
}

cancel_all_jobs() {
    # slurmstepd keeps a job's processes alive after slurmd exits, so jobs are cancelled first.
    pid_alive "$RUN_DIR/slurmctld.pid" || return 0
    local job_ids
    job_ids="$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)"
    [[ -n "${job_ids// /}" ]] || return 0
    say "cancelling jobs: $job_ids"
    # shellcheck disable=SC2086
    scancel $job_ids 2>/dev/null || true
    for _ in $(seq 30); do
        [[ -z "$(timeout 10 squeue -h -o %A 2>/dev/null || true)" ]] && return 0
        sleep 0.5
    done
    say "some jobs were still completing after 15 s: $(timeout 10 squeue -h -o '%A %T' | tr '\n' ' ')"
}

start_slurm() {
    mkdir -p "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR" "$RUN_DIR"
    write_config
    install_system_conf_link

    slurmctld -f "$CONF" || {
        show_log_tail "$LOG_DIR/slurmctld.log"
        fail "slurmctld did not start (see above)"
    }
    for _ in $(seq "$((WAIT_SECONDS * 2))"); do
        timeout 5 scontrol ping 2>/dev/null | grep -q "is UP" && break
        sleep 0.5
    done
    timeout 5 scontrol ping 2>/dev/null | grep -q "is UP" || {
        show_log_tail "$LOG_DIR/slurmctld.log"
        fail "slurmctld is not answering on port $CTLD_PORT after ${WAIT_SECONDS} s (see above)"
    }
    say "slurmctld started (pid $(cat "$RUN_DIR/slurmctld.pid"))"

    # -N: the node is named as slurmd -C printed, even if the hostname resolves oddly
    slurmd -f "$CONF" -N "$(node_name)" || {
        show_log_tail "$LOG_DIR/slurmd.log"
        fail "slurmd did not start (see above)"
    }
    for _ in $(seq 20); do # slurmd writes its pid file after forking
        pid_alive "$RUN_DIR/slurmd.pid" && break
        sleep 0.25
    done
    pid_alive "$RUN_DIR/slurmd.pid" || {
        show_log_tail "$LOG_DIR/slurmd.log"
        fail "slurmd exited right after starting (see above)"
    }
    say "slurmd started (pid $(cat "$RUN_DIR/slurmd.pid"))"
}

wait_until_node_idle() {
    local node state resumed=no
    node="$(node_name)"
    for _ in $(seq "$((WAIT_SECONDS * 2))"); do
        state="$(node_state)"
        case "$state" in
            idle | mix | alloc) return 0 ;;
            down* | drain* | drng*)
                # A node remembered as down from an earlier run stays down until resumed.
                if [[ "$resumed" == no ]]; then
                    scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
                    resumed=yes
                fi
                ;;
        esac
        sleep 0.5
    done
    show_log_tail "$LOG_DIR/slurmd.log"
    show_log_tail "$LOG_DIR/slurmctld.log"
    timeout 10 sinfo -N -l >&2 || true
    fail "node $node is '${state:-unreachable}', not idle, after ${WAIT_SECONDS} s (see logs above, reason: $(timeout 5 sinfo -h -N -n "$node" -o %E 2>/dev/null || true))"
}

cmd_start() {
    require_root start
    require_packages
    mkdir -p "$RUN_DIR"
    if pid_alive "$RUN_DIR/slurmctld.pid" && pid_alive "$RUN_DIR/slurmd.pid" && node_takes_jobs; then
        say "already running; node $(node_name) is $(node_state)"
        return 0
    fi
    # Half-started or stale: restart the Slurm daemons from a freshly written config.
    stop_daemon slurmd "$RUN_DIR/slurmd.pid"
    stop_daemon slurmctld "$RUN_DIR/slurmctld.pid"
    start_munge
    start_slurm
    wait_until_node_idle
    say "ready: node $(node_name) is $(node_state); partitions: $(sinfo -h -o %P | tr '\n' ' ')"
    say "config: $CONF   logs: $LOG_DIR"
}

cmd_stop() {
    require_root stop
    local purge="${1:-}"
    cancel_all_jobs
    stop_daemon slurmd "$RUN_DIR/slurmd.pid"
    stop_daemon slurmctld "$RUN_DIR/slurmctld.pid"
    if [[ -e "$RUN_DIR/munged.started-here" ]]; then
        munged --stop --socket="$MUNGE_SOCKET" >/dev/null 2>&1 || true
        say "stopped munged"
    fi
    remove_system_conf_link
    rm -rf "$SPOOL_DIR" "$LOG_DIR" "$RUN_DIR" "$CONF"
    if [[ "$purge" == --purge ]]; then
        rm -rf "$SLURM_DIR"
        say "removed $SLURM_DIR"
    fi
    say "stopped"
}

cmd_status() {
    local healthy=0 name
    for name in slurmctld slurmd; do
        if pid_alive "$RUN_DIR/$name.pid"; then
            say "$name running (pid $(cat "$RUN_DIR/$name.pid"))"
        else
            say "$name not running"
            healthy=1
        fi
    done
    if munge_works; then say "munged running"; else
        say "munged not running"
        healthy=1
    fi
    if [[ -f "$CONF" ]]; then
        say "config: $CONF"
        timeout 10 sinfo 2>&1 || true
    fi
    node_takes_jobs || healthy=1
    return "$healthy"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop "${2:-}" ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 start|stop [--purge]|status" >&2
        exit 2
        ;;
esac
