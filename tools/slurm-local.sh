#!/usr/bin/env bash
# slurm-local.sh - a one-node Slurm cluster on this machine, for the srun tests
# (tests/slurm/, docs/SHARDING.md "Slurm"): slurmctld and slurmd of Debian's
# slurm-wlm on 127.0.0.1, one node "localhost" in one partition, every file
# (config, state, spool, logs, pid files) in one temporary folder.
#
#   slurm-local.sh up [--cpus N]   starts the daemons, waits until `sinfo`
#       shows the node idle and prints the folder (one line); Slurm's commands
#       find the cluster through SLURM_CONF=<folder>/slurm.conf. N: the node's
#       CPUs (default: nproc, at least 4, so that a few ranks fit on a small
#       machine; Slurm is told to trust the config over the hardware).
#   slurm-local.sh down DIR        cancels the jobs, ends the daemons and the
#       job steps they started, removes DIR (idempotent)
#   slurm-local.sh run CMD...      up, CMD with SLURM_CONF set, down (also when
#       CMD fails or the script is interrupted); exits with CMD's status
#
# A cluster whose owner has exited without `down` (a `run` killed by SIGKILL;
# for `up`, the process VH_SLURM_OWNER names, if set) is removed by the next
# `up`.
#
# Authentication is auth/none (no munged; root on one machine), process
# tracking by /proc (no cgroups, which containers often lack), ports chosen
# free at `up`, so several clusters may run at once beside a real Slurm.
# Without slurm-wlm (apt-get install slurm-wlm) or when the daemons cannot
# start, `up` and `run` print one SKIPPED line with the reason and exit 77.
set -u
self=$(readlink -f "$0")

skip() { echo "slurm-local: SKIPPED: $*"; exit 77; }
die() { echo "slurm-local: $*" >&2; exit 2; }

# A TCP port nothing on 127.0.0.1 listens on (a race with another `up` is
# caught by the daemon failing to bind, which `up` reports).
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
    done
    return 1
}

write_conf() {
    local dir=$1 cpus=$2 ctld_port=$3 slurmd_port=$4
    cat >"$dir/slurm.conf" <<EOF
# written by tools/slurm-local.sh: one node on 127.0.0.1
ClusterName=vhlocal
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/builtin
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

# Every process that has DIR open or as its cwd: the daemons and the
# slurmstepd of each job step (its socket lives in DIR/spool).
procs_in() {
    local dir=$1 p
    for p in /proc/[0-9]*; do
        [ "${p#/proc/}" = "$$" ] && continue
        if readlink "$p/cwd" "$p"/fd/* 2>/dev/null | grep -q "^$dir/\|^$dir\$"; then
            echo "${p#/proc/}"
        fi
    done
}

cmd_down() {
    local dir=${1:-}
    [ -n "$dir" ] || die "down: which folder? (the line 'up' printed)"
    [ -f "$dir/slurm.conf" ] || { rm -rf "$dir"; return 0; }
    export SLURM_CONF=$dir/slurm.conf
    timeout 5 scancel --quiet --full --user=root 2>/dev/null
    local f pid
    for f in slurmd slurmctld; do
        pid=$(cat "$dir/$f.pid" 2>/dev/null) && kill -TERM "$pid" 2>/dev/null
    done
    for _ in $(seq 1 50); do
        [ -z "$(procs_in "$dir")" ] && break
        sleep 0.1
    done
    for pid in $(procs_in "$dir"); do kill -KILL "$pid" 2>/dev/null; done
    rm -rf "$dir"
    return 0
}

# Why the daemons did not come up: the end of their logs.
why_not() {
    local dir=$1
    for f in slurmctld.log slurmd.log slurmctld.out slurmd.out; do
        [ -s "$dir/$f" ] && { echo "--- $f"; tail -n 5 "$dir/$f"; }
    done
}

# Clusters whose owner (`run`, or VH_SLURM_OWNER at `up`) is gone: a test
# killed outright (SIGKILL, a ctest timeout) runs no trap.
reclaim() {
    local d owner
    for d in /tmp/vh-slurm.??????; do
        [ -f "$d/owner" ] || continue
        owner=$(cat "$d/owner")
        kill -0 "$owner" 2>/dev/null || cmd_down "$d"
    done
}

cmd_up() {
    local cpus=""
    while [ $# -gt 0 ]; do
        case $1 in
        --cpus) cpus=${2:-}; shift 2 ;;
        *) die "up: unknown option $1" ;;
        esac
    done
    local tool
    for tool in slurmctld slurmd srun sinfo scancel; do
        command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] ||
            skip "$tool not found (apt-get install slurm-wlm)"
    done
    [ "$(id -u)" -eq 0 ] || skip "not root (slurmd runs job steps as their user)"
    [ -n "$cpus" ] || { cpus=$(nproc); [ "$cpus" -lt 4 ] && cpus=4; }
    local dir ctld_port slurmd_port
    reclaim
    dir=$(mktemp -d /tmp/vh-slurm.XXXXXX) || die "cannot make a temporary folder"
    mkdir -p "$dir/state" "$dir/spool"
    [ -n "${VH_SLURM_OWNER:-}" ] && echo "$VH_SLURM_OWNER" >"$dir/owner"
    ctld_port=$(free_port) && slurmd_port=$(free_port) || { cmd_down "$dir"; skip "no free port"; }
    write_conf "$dir" "$cpus" "$ctld_port" "$slurmd_port"
    export SLURM_CONF=$dir/slurm.conf
    PATH=$PATH:/usr/sbin
    # -D: in the foreground of a background job, so a daemon that dies at
    # start says why in its .out; setsid: not in the caller's process group,
    # so a Ctrl-C to a test goes to `down`, which ends them in order.
    (cd "$dir" && exec setsid slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &)
    (cd "$dir" && exec setsid slurmd -D -N localhost -f "$SLURM_CONF" >"$dir/slurmd.out" 2>&1 &)
    local state=""
    for _ in $(seq 1 100); do
        state=$(timeout 5 sinfo -h -n localhost -o %t 2>/dev/null)
        [ "$state" = "idle" ] && { echo "$dir"; return 0; }
        sleep 0.2
    done
    local why
    why=$(why_not "$dir")
    cmd_down "$dir"
    echo "$why" >&2
    skip "the daemons did not bring node localhost to idle in 20 s (sinfo says '${state:-nothing}'; logs above)"
}

cmd_run() {
    [ $# -gt 0 ] || die "run: which command?"
    # a job of another cluster (ctest inside salloc) must not leak into this one
    local v
    for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done
    # global: the EXIT trap runs after this function has returned
    run_dir=$(VH_SLURM_OWNER=$$ cmd_up) || { local rc=$?; echo "$run_dir"; exit $rc; }
    trap 'cmd_down "$run_dir"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    SLURM_CONF=$run_dir/slurm.conf "$@"
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) shift; cmd_down "$@" ;;
run) shift; cmd_run "$@" ;;
*) echo "usage: $self up [--cpus N] | down DIR | run CMD..." >&2; exit 2 ;;
esac
