#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (build-fuzz/, VH_FUZZ=ON:
# ASan + UBSan + coverage) and runs each for a bounded time, starting from
# its seed corpus fuzz/corpus/<target>. Prints executions and crashes per
# target; exits 1 when any target crashed (the input is kept under
# build-fuzz/fuzz-artifacts/<target>/: fix the bug, then copy the input to
# fuzz/regressions/<target>/ so ctest replays it on every build).
#
#   tools/fuzz.sh [TARGET...]      default: every target
#   FUZZ_SECONDS=60                seconds per target (default 60)
#
# Without clang or its libFuzzer runtime it prints SKIPPED and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(recipe safetensors idx cifar image)

clang=$(command -v clang || true)
if [ -z "$clang" ] || ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { (void)d; (void)n; return 0; }' |
    "$clang" -x c -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
  echo "fuzz: SKIPPED: clang with libFuzzer not found (apt-get install clang libclang-rt-dev)"
  exit 0
fi

cmake -S . -B build-fuzz -DCMAKE_C_COMPILER="$clang" -DVH_FUZZ=ON -DVH_ENABLE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || exit 1
cmake --build build-fuzz -j"$(nproc)" --target vh_fuzz >/dev/null || {
  echo "fuzz: build failed; rerun: cmake --build build-fuzz --target vh_fuzz"; exit 1; }

# Inputs go through files (the readers take paths): tmpfs is 40x faster than disk.
scratch=/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && scratch=/dev/shm
declare -A max_len=([recipe]=4096 [safetensors]=4096 [idx]=8192 [cifar]=16384 [image]=16384)

failed=0
printf '%-12s %10s %8s %8s %s\n' target execs exec/s crashes corpus
for t in "${targets[@]}"; do
  bin=build-fuzz/tests/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t' ($bin)"; failed=1; continue; }
  work=build-fuzz/fuzz-corpus/$t        # grows run after run; the seeds stay as they are
  artifacts=build-fuzz/fuzz-artifacts/$t
  mkdir -p "$work" "$artifacts"
  log=build-fuzz/fuzz-$t.log
  before=$(ls "$artifacts" | wc -l)
  TMPDIR=$scratch ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin" "$work" "fuzz/corpus/$t" -max_total_time="$seconds" -max_len="${max_len[$t]:-4096}" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$(( $(ls "$artifacts" | wc -l) - before ))
  [ $rc -ne 0 ] && [ $crashes -eq 0 ] && crashes=1   # died without an artifact
  printf '%-12s %10s %8s %8s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes" "$(ls "$work" | wc -l) files"
  if [ $crashes -ne 0 ]; then
    failed=1
    echo "fuzz: $t crashed; log $log, inputs in $artifacts/:"
    grep -m3 -E 'ERROR|FINDING|SUMMARY|runtime error' "$log" | sed 's/^/    /'
  fi
done
exit $failed
