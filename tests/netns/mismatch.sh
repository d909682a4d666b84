#!/usr/bin/env bash
# A host with a stale recipe (another optim.lr) is refused at start, before a
# step, with one message naming the key, both values and both files.
. "$(dirname "$0")/common.sh"
hosts_up 2 --slots 2
sed 's/lr: 3.0e-3/lr: 0.1/' eq.yaml >stale.yaml
# ranks 0-1 on host 1 read eq.yaml, ranks 2-3 on host 2 read stale.yaml
mpi mm -np 2 "$VITHOST" run eq.yaml --out mm --set run.batch_size=3 : \
    -np 2 "$VITHOST" run stale.yaml --out mm --set run.batch_size=3
code=$?
line=$(grep -n '^optim:' eq.yaml | cut -d: -f1)
want="optim.lr is '3.0e-3' (eq.yaml:$line) on rank 0 but '0.1' (stale.yaml:$line) on rank 2"
grep -F "$want" mm.err || fail "exit $code, no '$want':$(echo; cat mm.err)"
[ $code = 3 ] || fail "exit $code, want 3 (a recipe error)"
[ ! -e mm/metrics.jsonl ] || fail "the refused run trained"
say "refused with exit 3 and the message above"
