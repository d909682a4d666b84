#!/usr/bin/env bash
# An interleaved A/B run of two builds of the SDK library: a command run ROUNDS times under
# each build in turn (A, B, A, B, ...), every output line labelled with its build, so that a
# shared machine's drift (+-30% here) lands on both sides alike. Only such comparisons count.
#
#   bench/ab_libs.sh DIR_A DIR_B ROUNDS -- COMMAND [ARGS...]
#
# DIR_A and DIR_B each hold a copy of a build's libvhsdk.so* (cp build/lib/libvhsdk.so* DIR
# before and after the change); COMMAND is any program linked to it through the build's
# RUNPATH (build/vithost, build/bench/bench_attention, build/bench/bench_gemm), which
# LD_LIBRARY_PATH overrides. For example, the attention op before and after a kernel change:
#
#   mkdir -p /tmp/a /tmp/b && cp build/lib/libvhsdk.so* /tmp/a
#   (edit, rebuild) && cp build/lib/libvhsdk.so* /tmp/b
#   bench/ab_libs.sh /tmp/a /tmp/b 8 -- build/bench/bench_attention 10 T3 bf16
#
# Plugins load the library the host has loaded, so a `vithost bench` runs wholly on the build
# named. Not a test: ctest never runs it.
set -euo pipefail
if [[ $# -lt 5 || $4 != "--" ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
a=$1 b=$2 rounds=$3
shift 4
for dir in "$a" "$b"; do
  if ! ls "$dir"/libvhsdk.so* > /dev/null 2>&1; then
    echo "ab_libs.sh: no libvhsdk.so in $dir (copy a build's build/lib/libvhsdk.so* there)" >&2
    exit 2
  fi
done
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "ab_libs.sh: ROUNDS must be a positive whole number, not '$rounds'" >&2
  exit 2
fi
for ((r = 1; r <= rounds; r++)); do
  for side in A B; do
    dir=$a
    [[ $side == B ]] && dir=$b
    LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@" 2>&1 | sed "s/^/$side $r: /"
  done
done
