#!/usr/bin/env bash
# test_srun.sh VITHOST SLURM_LOCAL - vithost under Slurm's srun on a one-node
# cluster of this machine (tools/slurm-local.sh), against one process:
#   - `srun -n 2 --mpi=pmix` DDP: the one-process losses at every step (1e-5
#     relative), world_size 2, stopped at step 10 and resumed under srun, the
#     stop line naming the srun command (the world from SLURM_STEP_NUM_TASKS);
#   - each rank is Slurm's task: a --set that differs by SLURM_PROCID is
#     refused naming rank 0's and rank 1's values;
#   - srun without a PMI is refused with what to type, not OpenMPI's page;
#   - one vithost in an `sbatch -n 2` script is one process (run.comm self).
# Exits 77 with one SKIPPED line without slurm-wlm, PMIx, root or MPI backend.
set -u
if [ "${1:-}" != --inside ]; then
    [ $# -eq 2 ] || { echo "usage: $0 VITHOST SLURM_LOCAL" >&2; exit 2; }
    vithost=$(readlink -f "$1")
    [ -e "$(dirname "$vithost")/lib/libvh_comm_mpi.so" ] ||
        { echo "test_srun: SKIPPED: vithost was built without the MPI backend"; exit 77; }
    exec "$2" run "$0" --inside "$vithost"
fi
vithost=$2
recipe=$(readlink -f "$(dirname "$0")/../data/recipes/small_vit_eq.yaml")
if ! srun --mpi=list 2>&1 | grep -qw pmix; then
    echo "test_srun: SKIPPED: this Slurm has no PMIx plugin (srun --mpi=list)"
    exit 77
fi

work=$(mktemp -d /tmp/vh-srun.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 2
export OMP_NUM_THREADS=1

fail() { echo "test_srun: FAILED: $*"; for f in "$work"/*.log; do echo "--- $f"; tail -n 8 "$f"; done; exit 1; }

# The netns tests' recipe, run 20 steps (240 samples = 20 steps of 12) with an
# evaluation at step 10.
sed 's/steps: 10, log_every: 1, eval_every: 0/steps: 20, log_every: 1, eval_every: 10/' \
    "$recipe" >eq.yaml && grep -q 'steps: 20' eq.yaml || fail "no $recipe"

# "step loss world_size" of each training line of a run folder's metrics.
train_lines() {
    sed -n '/"loss":/{/eval_/!p}' "$1/metrics.jsonl" |
        sed -E 's/.*"step":([0-9]+).*"loss":([^,]+).*"world_size":([0-9]+).*/\1 \2 \3/'
}

# -- the equivalence: one process against srun -n 2, stopped and resumed -------
"$vithost" run eq.yaml --out one --set run.batch_size=12 >one.log 2>&1 ||
    fail "one process exited $?"
srun -n 2 --mpi=pmix "$vithost" run eq.yaml --out two --set run.batch_size=6 --stop-after 10 \
    >stop.log 2>&1
rc=$?
[ $rc -eq 5 ] || fail "srun -n 2 --stop-after 10 exited $rc, not 5 (stopped)"
srun -n 2 --mpi=pmix "$vithost" run eq.yaml --out two --set run.batch_size=6 --resume \
    >two.log 2>&1 || fail "srun -n 2 --resume exited $?"
train_lines one >one.txt
train_lines two >two.txt
[ "$(wc -l <one.txt)" -eq 20 ] || fail "one process logged $(wc -l <one.txt) steps, not 20"
awk 'NR == FNR { ref[$1] = $2; next }
     { seen[$1] = 1
       if ($3 != 2) { printf "step %d: world_size %d, not 2\n", $1, $3; bad = 1 }
       rel = ($2 - ref[$1]) / ref[$1]; if (rel < 0) rel = -rel
       if (!($1 in ref) || rel > 1e-5) {
           printf "step %d: loss %s, one process %s (relative %.2g)\n", $1, $2, ref[$1], rel; bad = 1 } }
     END { for (s = 1; s <= 20; s++) if (!(s in seen)) { printf "step %d missing\n", s; bad = 1 }
           exit bad }' one.txt two.txt >compare.log || fail "srun -n 2 is not one process: $(head -n 3 compare.log)"
grep -q "continue with: srun --mpi=pmix -n 2 vithost run eq.yaml" stop.log ||
    fail "the stop line does not name 'srun --mpi=pmix -n 2'"

# -- the ranks are Slurm's tasks ------------------------------------------------
srun -n 2 --mpi=pmix bash -c 'exec "$0" run eq.yaml --out ranks --set run.batch_size=6 \
    --set run.seed=$((3 + SLURM_PROCID))' "$vithost" >ranks.log 2>&1
rc=$?
[ $rc -ne 0 ] || fail "ranks with different seeds were not refused"
grep -q "run.seed is '3' (--set) on rank 0 but '4' (--set) on rank 1" ranks.log ||
    fail "the refusal does not name rank 0's seed 3 and rank 1's seed 4"

# -- srun without a PMI ---------------------------------------------------------
srun -n 2 --mpi=none "$vithost" run eq.yaml --out nopmi --set run.batch_size=6 >nopmi.log 2>&1 &&
    fail "srun --mpi=none was not refused"
grep -q "srun gave these 2 processes no PMI (--mpi=none).*srun --mpi=pmix -n 2" nopmi.log ||
    fail "srun --mpi=none: no message saying to use srun --mpi=pmix"

# -- one process in an sbatch script of 2 tasks --------------------------------
printf '#!/bin/sh\nexec "%s" run eq.yaml --out batch --set run.batch_size=12 --set run.steps=2 --set run.comm=self\n' \
    "$vithost" >job.sh
timeout 30 sbatch --wait -n 2 -D "$work" -o batch.log job.sh >sbatch.log 2>&1 ||
    fail "vithost alone in an sbatch -n 2 script exited non-zero (run.comm self refused?)"
[ "$(train_lines batch | tail -n 1 | cut -d' ' -f3)" = 1 ] || fail "the sbatch run's world_size is not 1"

echo "test_srun: srun -n 2 --mpi=pmix matches one process over 20 steps (stopped at 10, resumed); ranks, no-PMI and sbatch checks pass"
