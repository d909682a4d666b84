#!/usr/bin/env bash
# Builds vithost twice, normally and with AddressSanitizer + UBSan, warnings as
# errors, and runs every test in both builds. Build folders: build/, build-asan/.
# Then a subset under ThreadSanitizer and valgrind, and the fuzz targets.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake -S . -B build -DVH_WERROR=ON
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -LE netns
# Ranks on network-namespace hosts (tests/netns; one SKIPPED line each where
# namespaces cannot be made), alone, each once more if it fails: OpenMPI
# launched into the namespaces sometimes hangs (docs/SHARDING.md, "Across
# machines"); a test that fails twice fails.
ctest --test-dir build --output-on-failure -L netns --repeat until-pass:2

cmake -S . -B build-asan -DVH_WERROR=ON -DVH_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
cmake --build build-asan -j"$jobs"
# (the netns tests, ranks on network-namespace hosts, ran in build/ above;
# under ASan they would only be slower: -LE netns)
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE netns

# ThreadSanitizer, valgrind memcheck and the fuzz targets (30 s each here;
# FUZZ_SECONDS to change): build-tsan/, build/ again (valgrind needs no
# build of its own), build-fuzz/. A part whose tool is missing prints SKIPPED.
timed() { local start=$SECONDS; "$@"; echo "test.sh: $1 took $((SECONDS - start)) s"; }
timed tools/tsan.sh
VALGRIND_BUILD=build timed tools/valgrind.sh
FUZZ_SECONDS=${FUZZ_SECONDS:-30} timed tools/fuzz.sh
