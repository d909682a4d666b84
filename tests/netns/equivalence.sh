#!/usr/bin/env bash
# DDP and FSDP with 2 ranks on each of 2 hosts (4 ranks, TCP between every
# pair, no shared memory) give the one-process losses within 1e-5 relative.
# (VH_NETNS_EXTRA: vithost options for the 4 ranks only, to see it fail.)
. "$(dirname "$0")/common.sh"
hosts_up 2 --slots 2
one_process one
for plugin in ddp fsdp; do
    mpi "$plugin" -np 4 "$VITHOST" run eq.yaml --out "$plugin" --set run.batch_size=3 \
        --set sharding.plugin="$plugin" ${VH_NETNS_EXTRA:-} || fail "$plugin on 2 x 2: $(tail -5 "$plugin.err")"
    grep -q '"world_size":4' "$plugin/metrics.jsonl" || fail "$plugin: not 4 ranks"
    same_losses one "$plugin" "$plugin, 2 hosts x 2 ranks" || fail "$plugin: losses differ"
done
say "passed"
