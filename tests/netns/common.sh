# common.sh - sourced by the tests of tests/netns/: ranks of `vithost run` on
# separate hosts (network namespaces, tools/netns-hosts.sh) over TCP.
# ctest passes VITHOST (the binary), NETNS_HOSTS (tools/netns-hosts.sh) and
# VH_MPIRUN (mpirun, empty without OpenMPI). Exit 77: skipped.
set -u
name=$(basename "$0" .sh)
export VITHOST_PLUGIN_PATH= OMP_NUM_THREADS=1

fail() { echo "$name: FAILED: $*"; exit 1; }
say() { echo "$name: $*"; }

[ -n "${VH_MPIRUN:-}" ] || { say "SKIPPED: OpenMPI (mpirun) not found at configure time"; exit 77; }
[ -x "${VITHOST:-}" ] || fail "VITHOST='${VITHOST:-}' is not the vithost binary"

work=$(mktemp -d /tmp/vh-netns-XXXXXX)
VH_NETNS=
cleanup() {
    [ -n "$VH_NETNS" ] && "$NETNS_HOSTS" down "$VH_NETNS"
    rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 1

# hosts_up N [options of netns-hosts.sh up]: the set, or exit 77 with its line
hosts_up() {
    local out rc
    hosts_n=$1
    out=$(VH_NETNS_OWNER=$$ "$NETNS_HOSTS" up "$@")
    rc=$?
    [ $rc = 77 ] && { say "${out#netns-hosts: }"; exit 77; }
    [ $rc = 0 ] || fail "netns-hosts.sh up $*: $out"
    export VH_NETNS=$out
    net=${VH_NETNS_NET:-10.213}.$VH_NETNS
}

# mpirun over the hosts (TCP only); the command's output in $1.out/$1.err.
# OpenMPI launched into the namespaces now and then hangs with no message:
# before a daemon starts a rank, or after the ranks are done (seen beside
# other OpenMPI jobs on a loaded machine, about one launch in 30). So an
# attempt that starts no rank within 30 s, or (MPI_ATTEMPT_S, 60; 0: no
# limit) has not ended by then, is killed and made again into a fresh --out
# folder $1, at most twice, saying so. A resume ($1 = resume) is only
# launched again when it started no rank.
mpi() {
    local log=$1 try pid t seen limit=${MPI_ATTEMPT_S:-60}
    shift
    for try in 1 2 3; do
        [ "$try" -gt 1 ] && [ "$log" != resume ] && rm -rf "$log"
        timeout -k 5 240 "$NETNS_HOSTS" mpirun -x OMP_NUM_THREADS=1 -x VITHOST_PLUGIN_PATH "$@" \
            >"$log.out" 2>"$log.err" &
        pid=$!
        seen=0 t=0
        while kill -0 $pid 2>/dev/null; do
            [ $seen = 0 ] && [ "$(ranks_left)" -gt 0 ] && seen=1
            [ $seen = 0 ] && [ $t -ge 150 ] && break
            [ "$limit" != 0 ] && [ "$log" != resume ] && [ $t -ge $((limit * 5)) ] && break
            sleep 0.2
            t=$((t + 1))
        done
        if kill -0 $pid 2>/dev/null; then
            say "launch $try of $log hung ($([ $seen = 0 ] && echo no rank started || echo not ended)): killing it, launching again"
            for t in $(seq 0 "$hosts_n"); do "$NETNS_HOSTS" kill "$t"; done
            wait $pid 2>/dev/null
            continue
        fi
        wait $pid
        return $?
    done
    fail "$log: three launches hung"
}

# The recipe every test here runs (a global batch of 12, the per-rank batch
# set per launch).
cp "$(dirname "${BASH_SOURCE[0]}")/../data/recipes/small_vit_eq.yaml" eq.yaml ||
    fail "no tests/data/recipes/small_vit_eq.yaml"

# one_process DIR [vithost options]: the reference run
one_process() {
    local dir=$1
    shift
    "$VITHOST" run eq.yaml --out "$dir" --set run.batch_size=12 "$@" >"$dir.out" 2>"$dir.err"
    local code=$?
    # 5: stopped by --stop-after, with a checkpoint
    [ $code = 0 ] || [ $code = 5 ] || fail "one process: exit $code: $(cat "$dir.err")"
}

# jsonl_field FILE KEY: "step value" of each training line that has KEY
jsonl_field() {
    awk -v k="\"$2\":" '/"loss"/ && index($0, k) {
        s = $0; sub(/.*"step":/, "", s); sub(/[,}].*/, "", s)
        v = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", v)
        print s, v }' "$1"
}

# same_losses REF_DIR DIR WHAT: every step of DIR's metrics has REF's loss
# within 1e-5 relative; prints the worst difference
same_losses() {
    jsonl_field "$1/metrics.jsonl" loss >ref.txt
    jsonl_field "$2/metrics.jsonl" loss >got.txt
    awk -v what="$3" -v tol="${VH_NETNS_TOL:-1e-5}" '
        FNR == NR { ref[$1] = $2; next }
        { n++; if (!($1 in ref)) { bad = bad " step " $1 " (no reference)"; next }
          r = ($2 - ref[$1]) / ref[$1]; if (r < 0) r = -r
          if (r > worst) worst = r
          if (!(r <= tol)) bad = bad sprintf(" step %d: %s vs %s", $1, $2, ref[$1]) }
        END { printf "%s: %d steps, worst relative loss difference %.2g (tolerance %g)\n",
                     what, n, worst, tol
              if (bad != "" || n == 0) { print what ": differs:" bad; exit 1 } }' ref.txt got.txt
}

# ranks_left: vithost processes still running in the set's hosts (not host 0,
# the launcher's, where mpirun's own command line names vithost)
ranks_left() {
    local ns pid n=0
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^vh${VH_NETNS}h[1-9][0-9]*$"); do
        for pid in $(ip netns pids "$ns"); do
            grep -q vithost "/proc/$pid/cmdline" 2>/dev/null && n=$((n + 1))
        done
    done
    echo $n
}
