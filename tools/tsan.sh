#!/usr/bin/env bash
# Builds vithost with ThreadSanitizer (build-tsan/, VH_TSAN=ON) and runs the
# parts that have threads of their own: the SDK's prefetcher and data pass
# with the data plugins' workers (test_data_plugins, test_imagefolder), the
# optimizer's two ranks on threads (test_mta 'test_two_ranks*'), the MPI collectives under
# mpirun (test_comm_mpi; OpenMPI is not instrumented, its reports are
# suppressed), and a short `vithost run` of the test plugins.
#
# OpenMP: libgomp is not instrumented, so TSan cannot see its barriers and
# reports races between the threads of a parallel region that are not there.
# The runs use OMP_NUM_THREADS=1 (no OpenMP worker threads), and reports
# from libgomp's own threads are suppressed; our pthreads (prefetch workers,
# the test's rank threads) are all checked. Exits 1 on any report.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-tsan
if ! echo 'int main(void) { return 0; }' | cc -x c -fsanitize=thread -o /dev/null - 2>/dev/null; then
  echo "tsan: SKIPPED: the C compiler cannot build with -fsanitize=thread (apt-get install libtsan2)"
  exit 0
fi
cmake -S . -B "$build" -DVH_WERROR=ON -DVH_TSAN=ON -DVH_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
targets=(test_data_plugins test_imagefolder test_mta vithost vh_test_plugins vh_plugin_synthetic)
have_mpi=0
if command -v mpirun >/dev/null && [ -n "$(find "$build" -name comm_mpi.c.o -o -name 'vh_comm_mpi.dir' | head -1)" ]; then
  targets+=(test_comm_mpi) && have_mpi=1
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >/dev/null ||
  { echo "tsan: build failed; rerun: cmake --build $build"; exit 1; }

logs=$build/tsan
rm -rf "$logs" && mkdir -p "$logs"
supp=$logs/tsan.supp
# Third-party code only: libgomp (see above) and OpenMPI (its own locks: a
# lock-order inversion in mca_btl_tcp and an unlock TSan cannot match in
# mca_pml_ob1, both inside OpenMPI, are what a clean run of test_comm_mpi shows).
cat >"$supp" <<'SUPP'
called_from_lib:libgomp.so
race:libgomp.so
called_from_lib:libmpi.so
called_from_lib:libopen-pal.so
called_from_lib:libopen-rte.so
race:libopen-pal.so
race:libmpi.so
race:mca_
deadlock:mca_
mutex:mca_
deadlock:libopen-pal.so
mutex:libopen-pal.so
deadlock:libmpi.so
mutex:libmpi.so
SUPP
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 VITHOST_PLUGIN_PATH=
export TSAN_OPTIONS="halt_on_error=0 exitcode=66 second_deadlock_stack=1 suppressions=$PWD/$supp log_path=$PWD/$logs/report"

failed=0
check() { # name expected-exit-code command...
  local name=$1 want=$2; shift 2
  local start=$SECONDS rc=0
  "$@" >"$logs/$name.out" 2>&1 || rc=$?
  local reports
  reports=$(cat "$logs"/report.* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer' || true)
  if [ $rc -eq "$want" ] && [ "$reports" -eq 0 ]; then
    printf 'tsan: %-22s ok (%ds)\n' "$name" $((SECONDS - start))
  else
    failed=1
    printf 'tsan: %-22s FAILED (exit %d, %d reports, %ds); output: %s/%s.out\n' "$name" $rc \
      "$reports" $((SECONDS - start)) "$logs" "$name"
    for r in "$logs"/report.*; do [ -f "$r" ] && mv "$r" "$logs/$name.${r##*.}.tsan"; done
    cat "$logs/$name".*.tsan 2>/dev/null | grep -E '^WARNING|^    #[0-3] ' | head -30
  fi
  rm -f "$logs"/report.*
}

check test_data_plugins 0 "$build/tests/test_data_plugins"
check test_imagefolder 0 "$build/tests/test_imagefolder"
# test_mta: only its two ranks on threads; its other tests run OpenMP with 2
# threads on purpose (the thread-count digest), which TSan cannot follow.
if grep -q cmocka_set_test_filter tests/test_mta.c; then
  check test_mta_two_ranks 0 "$build/tests/test_mta" 'test_two_ranks*'
else
  echo "tsan: test_mta SKIPPED: it takes no test filter (its other tests run OpenMP threads)"
fi
# The test plugins with synthetic data on 2 prefetch workers; peak_tflops
# given, so no sgemm probe.
check vithost_run 0 "$build/vithost" run configs/test-plugins.yaml --set run.peak_tflops=1 \
  --set data.plugin=synthetic --set data.image_size=8 --set data.num_classes=4 \
  --set data.train_size=512 --set data.eval_size=64 --set data.workers=2 --out "$tmp/run"
if [ $have_mpi -eq 1 ]; then
  check test_comm_mpi 0 mpirun --oversubscribe --allow-run-as-root -np 3 \
    -x TSAN_OPTIONS -x OMP_NUM_THREADS "$build/tests/sharding/test_comm_mpi"
else
  echo "tsan: test_comm_mpi SKIPPED: OpenMPI (mpirun, libopenmpi-dev) not found"
fi
exit $failed
