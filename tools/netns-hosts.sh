#!/usr/bin/env bash
# netns-hosts.sh - separate "hosts" on this machine, for the multi-host tests:
# N Linux network namespaces joined by a bridge, each with its own interface
# and address, so that MPI ranks placed in them talk over TCP across veth
# links as across a network (tests/netns/, docs/SHARDING.md "Across machines").
#
#   netns-hosts.sh up N [--slots S] [--delay-ms D] [--delay-host I]
#       makes a set of N hosts and prints its id (one line). Host i (1..N) is
#       namespace vh<id>h<i> with address 10.213.<id>.<i>/24 on its eth0,
#       on the bridge vhbr<id>; host 0 (10.213.<id>.254) is the launcher's,
#       where `mpirun` below runs. The root namespace gets no address. --delay-ms adds tc netem delay D ms to
#       everything host I (default: the last) sends. --slots S: ranks per host
#       in the hostfile (default 2).
#   netns-hosts.sh down [ID]       removes the set (all of it, idempotent)
#   netns-hosts.sh exec I CMD...   runs CMD in host I's namespace
#   netns-hosts.sh mpirun ARGS...  mpirun over the set's hostfile: TCP only
#                                  (btl tcp,self, pml ob1), on the set's subnet
#   netns-hosts.sh shape I --delay-ms D | --rate-mbit R | --clear
#                                  delays (tc netem: exit 3 where the kernel
#                                  lacks it) or limits (tc tbf) what I sends
#   netns-hosts.sh link I up|down  sets host I's link (a vanished network)
#   netns-hosts.sh kill I          SIGKILLs every process in host I (a vanished host)
#   netns-hosts.sh agent ADDR CMD  OpenMPI's launch agent (plm_rsh_agent): runs
#                                  the daemon's command in the namespace of ADDR
#
# ID comes from the argument or $VH_NETNS. Sets are numbered 1..200 and locked
# by mkdir under /run/vithost-netns, so tests may run concurrently; a set whose
# owner (the process that ran `up`'s parent) is gone is reclaimed by the next
# `up`. Without root, iproute2 or the right to create namespaces (an
# unprivileged container), `up` prints one SKIPPED line and exits 77.
set -u
NET=${VH_NETNS_NET:-10.213}
STATE=${VH_NETNS_STATE:-/run/vithost-netns}
self=$(readlink -f "$0")

skip() { echo "netns-hosts: SKIPPED: $*"; exit 77; }
die() { echo "netns-hosts: $*" >&2; exit 2; }

set_id() {
    id=${1:-${VH_NETNS:-}}
    [[ "$id" =~ ^[0-9]+$ ]] || die "no set id (give it, or set VH_NETNS to what 'up' printed)"
    dir=$STATE/$id
}
ns_of() { echo "vh${id}h$1"; }

cmd_down() {
    set_id "${1:-}"
    local n=0 i pid
    [ -f "$dir/n" ] && n=$(cat "$dir/n")
    # every namespace named vh<id>h*, whatever n says (an `up` that died half way)
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^vh${id}h[0-9]+$"); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
        ip netns delete "$ns" 2>/dev/null
    done
    # deleting a namespace deletes its veth end, and with it the pair
    for i in $(seq 0 "$n"); do ip link delete "vh${id}v$i" 2>/dev/null; done
    ip link delete "vhbr$id" 2>/dev/null
    rm -rf "$dir"
    return 0
}

# A free set id, locked; reclaims sets whose owner has exited.
claim() {
    mkdir -p "$STATE" || skip "cannot write $STATE"
    local k owner
    for k in $(seq 1 200); do
        if mkdir "$STATE/$k" 2>/dev/null; then
            id=$k
            dir=$STATE/$k
            echo "$owner_pid" >"$dir/owner"
            return 0
        fi
        owner=$(cat "$STATE/$k/owner" 2>/dev/null)
        if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then
            VH_NETNS= cmd_down "$k" >/dev/null 2>&1
            if mkdir "$STATE/$k" 2>/dev/null; then
                id=$k dir=$STATE/$k
                echo "$owner_pid" >"$dir/owner"
                return 0
            fi
        fi
    done
    die "no free set id under $STATE (200 in use: netns-hosts.sh down ID)"
}

cmd_up() {
    local n=${1:-} slots=2 delay=0 dhost=
    shift || true
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up N: N hosts, 1..250"
    while [ $# -gt 0 ]; do
        case $1 in
        --slots) slots=$2; shift 2 ;;
        --delay-ms) delay=$2; shift 2 ;;
        --delay-host) dhost=$2; shift 2 ;;
        *) die "up: unknown option $1" ;;
        esac
    done
    dhost=${dhost:-$n}
    [ "$(id -u)" = 0 ] || skip "network namespaces need root (uid $(id -u))"
    command -v ip >/dev/null || skip "iproute2 (ip) not installed"
    if [ "$delay" != 0 ]; then command -v tc >/dev/null || skip "tc (iproute2) not installed"; fi
    owner_pid=${VH_NETNS_OWNER:-$PPID}
    claim
    echo "$n" >"$dir/n"
    # from here a failure removes what was made
    local err rc
    # (not in an `if`: there bash would ignore make_set's set -e)
    err=$(make_set "$n" "$slots" 2>&1)
    rc=$?
    if [ $rc != 0 ]; then
        cmd_down "$id" >/dev/null 2>&1
        skip "cannot create network namespaces here ($(echo "$err" | tail -1))"
    fi
    if [ "$delay" != 0 ] && ! err=$(cmd_shape "$dhost" --delay-ms "$delay" 2>&1); then
        cmd_down "$id" >/dev/null 2>&1
        die "$err"
    fi
    echo "$id"
}

make_set() {
    local n=$1 slots=$2 i ns
    set -e
    ip link add "vhbr$id" type bridge
    ip link set "vhbr$id" up
    : >"$dir/hosts"
    # host 0 is the launcher's (a login node, .254), not in the hostfile
    for i in $(seq 0 "$n"); do
        ns=$(ns_of "$i")
        ip netns add "$ns"
        ip link add "vh${id}v$i" type veth peer name eth0 netns "$ns"
        ip link set "vh${id}v$i" master "vhbr$id"
        ip link set "vh${id}v$i" up
        ip -n "$ns" addr add "$NET.$id.$((i == 0 ? 254 : i))/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        # TCP gives up on a silent peer after ~13 s of retries (Linux: 15,
        # about 15 min): a launcher's message to a gone host fails in time
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5
        [ "$i" = 0 ] || echo "$NET.$id.$i slots=$slots" >>"$dir/hosts"
    done
    # the launcher reaches the last host over the bridge (ARP and TCP, no ping here)
    ip netns exec "$(ns_of 0)" bash -c "exec 3<>/dev/tcp/$NET.$id.$n/9" 2>/dev/null || true
    ip -n "$(ns_of 0)" neigh show | grep -q "$NET.$id.$n " ||
        { echo "the launcher (host 0) does not reach host $n over the bridge" >&2; return 1; }
}

# shape I --delay-ms D | --rate-mbit R | --clear: what host I sends is
# delayed (tc netem) or limited (tc tbf), or neither again.
cmd_shape() {
    local ns
    ns=$(ns_of "$1")
    ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null
    case ${2:-} in
    --delay-ms)
        ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "${3}ms" 2>/dev/null ||
            { echo "netns-hosts: tc netem is not available in this kernel (sch_netem)" >&2; return 3; } ;;
    --rate-mbit)
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${3}mbit" burst 16kbit \
            latency 1s || return 3 ;;
    --clear) ;;
    *) die "shape I --delay-ms D | --rate-mbit R | --clear" ;;
    esac
}

cmd_mpirun() {
    set_id ""
    [ -f "$dir/hosts" ] || die "set $id is not up"
    # no shared memory between ranks: only the TCP and self transports, and
    # the ob1 layer over them (UCX would bring its own shared-memory path).
    # The daemons' keepalive: mpirun notices a silent host in 15 + 3 x 5 s
    # (OpenMPI's default is 300 + 9 x 20 s), and the daemon there its loss.
    exec ip netns exec "$(ns_of 0)" mpirun --allow-run-as-root --hostfile "$dir/hosts" \
        --mca plm_rsh_agent "$self agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca pml ob1 --mca btl tcp,self \
        --mca oob_tcp_keepalive_time 15 --mca oob_tcp_keepalive_intvl 5 \
        --mca oob_tcp_keepalive_probes 3 \
        --mca btl_tcp_if_include "$NET.$id.0/24" --mca oob_tcp_if_include "$NET.$id.0/24" \
        "$@"
}

# OpenMPI calls: agent <host> <command words...>; host is an address of a set.
cmd_agent() {
    local host=$1
    shift
    [[ "$host" =~ ^${NET//./\\.}\.([0-9]+)\.([0-9]+)$ ]] || die "agent: $host is no host of a set"
    id=${BASH_REMATCH[1]}
    exec ip netns exec "$(ns_of "${BASH_REMATCH[2]}")" /bin/sh -c "$*"
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) shift; cmd_down "${1:-}" ;;
exec) shift; set_id ""; i=$1; shift; exec ip netns exec "$(ns_of "$i")" "$@" ;;
link) set_id ""; ip -n "$(ns_of "$2")" link set eth0 "$3" ;;
shape) set_id ""; shift; cmd_shape "$@" ;;
kill) set_id ""; for pid in $(ip netns pids "$(ns_of "$2")"); do kill -9 "$pid" 2>/dev/null; done ;;
mpirun) shift; cmd_mpirun "$@" ;;
agent) shift; cmd_agent "$@" ;;
*) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2 ;;
esac
