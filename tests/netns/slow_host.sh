#!/usr/bin/env bash
# A slow host: 10 ms netem delay on everything host 2 sends. DDP on 2 x 2
# ranks with its bucketed overlap (sharding.bucket_mb=0: one bucket per unit,
# each all-reduce started as its unit's backward ends) and without (a bucket
# larger than the model: one all-reduce after the whole backward); without
# the delay the two were within this shared machine's noise. Prints
# comm_wait_ms_per_step (mean of steps 2-10) and ms per step; a measurement,
# not a timed assertion: it fails only when a run fails or reports no
# comm_wait.
. "$(dirname "$0")/common.sh"
delay=${VH_NETNS_DELAY_MS:-10}
hosts_up 2 --slots 2
# netem where the kernel has it; else (this build machine's kernel has no
# sch_netem) a slow link instead: 8 Mbit/s out of host 2 (tc tbf)
if "$NETNS_HOSTS" shape 2 --delay-ms "$delay"; then
    slow="${delay} ms"
else
    "$NETNS_HOSTS" shape 2 --rate-mbit 8 || fail "tc tbf on host 2"
    slow="8 Mbit/s"
    say "no tc netem here: host 2 is slowed by a rate limit (8 Mbit/s) instead of a delay"
fi
# mean of KEY over steps >= 2 of DIR's metrics
mean() {
    jsonl_field "$1/metrics.jsonl" "$2" | awk '$1 >= 2 { s += $2; n++ }
        END { if (n) printf "%.1f", s / n; else print "none" }'
}
run() { # DIR LABEL bucket_mb
    mpi "$1" -np 4 "$VITHOST" run eq.yaml --out "$1" --set run.batch_size=3 \
        --set sharding.bucket_mb="$3" || fail "$1: $(tail -5 "$1.err")"
    local wait ips
    wait=$(mean "$1" comm_wait_ms_per_step)
    ips=$(mean "$1" img_per_s)
    [ "$wait" != none ] || fail "$1: no comm_wait_ms_per_step in metrics.jsonl"
    printf '%s: %-34s comm_wait_ms_per_step %6s   ms per step %6.1f\n' "$name" "$2" "$wait" \
        "$(awk -v i="$ips" 'BEGIN { print (i > 0 ? 12000 / i : 0) }')"
}
run slow_overlap "$slow, overlap (bucket_mb 0)" 0
run slow_one "$slow, no overlap (one bucket)" 1000
say "passed (a measurement)"
