#!/usr/bin/env bash
# Runs a bounded subset of the tests under valgrind memcheck, in a build
# without sanitizers (build-vg/): the loader's plugin load/unload cycles
# (test_loader), the CLI (test_cli: its vithost children run outside valgrind;
# under it some of them take minutes), the recipe and config parsers, the
# fuzz targets' replays, and vithost itself: `plugins`, `check`, a short
# `run` of configs/test-plugins.yaml stopped and resumed, and `eval`.
#
# Every run: --error-exitcode=1 --leak-check=full; definite and indirect
# leaks are errors. tools/valgrind.supp holds suppressions for third-party
# libraries only. Without valgrind it prints SKIPPED and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null; then
  echo "valgrind: SKIPPED: valgrind not found (apt-get install valgrind)"
  exit 0
fi
# VALGRIND_BUILD=DIR uses an existing build without sanitizers as it is
# configured (tools/test.sh passes build/, which it has just built).
build=${VALGRIND_BUILD:-build-vg}
if [ -z "${VALGRIND_BUILD:-}" ]; then
  cmake -S . -B "$build" -DVH_WERROR=ON -DVH_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >/dev/null || exit 1
elif grep -qE '^VH_(SANITIZE|TSAN|FUZZ):BOOL=ON' "$build/CMakeCache.txt"; then
  echo "valgrind: $build is a sanitizer build; valgrind needs one without"
  exit 1
fi
cmake --build "$build" -j"$(nproc)" --target vithost test_loader test_cli test_recipe test_config \
  fuzz_recipe_replay fuzz_safetensors_replay fuzz_idx_replay fuzz_cifar_replay fuzz_image_replay \
  >/dev/null || { echo "valgrind: build failed; rerun: cmake --build $build"; exit 1; }

logs=$build/valgrind
rm -rf "$logs" && mkdir -p "$logs"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One thread for OpenMP and oneDNN: valgrind runs threads one at a time anyway.
export OMP_NUM_THREADS=1 VITHOST_PLUGIN_PATH=
vg=(valgrind -q --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect
    --errors-for-leak-kinds=definite,indirect --suppressions="$PWD/tools/valgrind.supp"
    --gen-suppressions=all --num-callers=30)

failed=0
check() { # name expected-exit-code command...
  local name=$1 want=$2; shift 2
  local start=$SECONDS rc=0
  "${vg[@]}" --log-file="$logs/$name.%p.log" "$@" >"$logs/$name.out" 2>&1 || rc=$?
  if [ $rc -eq "$want" ]; then
    printf 'valgrind: %-28s ok (%ds)\n' "$name" $((SECONDS - start))
  else
    failed=1
    printf 'valgrind: %-28s FAILED (exit %d, %ds); logs: %s/%s.*\n' "$name" $rc $((SECONDS - start)) "$logs" "$name"
    cat "$logs/$name".*.log | grep -v '^==[0-9]*== *$' | head -40
    tail -5 "$logs/$name.out"
  fi
}

check test_recipe 0 "$build/tests/test_recipe"
check test_config 0 "$build/tests/test_config"
check test_loader 0 "$build/tests/test_loader"
check test_cli 0 "$build/tests/test_cli"
for t in recipe safetensors idx cifar image; do
  check "fuzz_replay_$t" 0 "$build/tests/fuzz_${t}_replay" "fuzz/corpus/$t" "fuzz/regressions/$t"
done
check vithost_plugins 0 "$build/vithost" plugins
check vithost_check 0 "$build/vithost" check configs/test-plugins.yaml --set run.epochs=1
# peak_tflops given: the CPU's sgemm probe takes minutes under valgrind.
fast=(--set run.peak_tflops=1)
check vithost_run 5 "$build/vithost" run configs/test-plugins.yaml "${fast[@]}" --out "$tmp/run" \
  --stop-after 8
check vithost_resume 0 "$build/vithost" run configs/test-plugins.yaml "${fast[@]}" \
  --out "$tmp/run" --resume
check vithost_eval 0 "$build/vithost" eval configs/test-plugins.yaml "${fast[@]}" --checkpoint "$tmp/run"
exit $failed
