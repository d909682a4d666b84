#!/usr/bin/env bash
# Installs the Debian packages vithost builds and tests with, and only those
# that are missing. Runs apt-get as root, through sudo otherwise.
set -euo pipefail

packages=(
  build-essential cmake pkg-config   # toolchain
  libyaml-dev                        # recipes
  libcmocka-dev                      # tests
  libdnnl-dev                        # CPU GEMMs (oneDNN 2.x); its OpenMP build shares one thread pool with ours
  zlib1g-dev libjpeg-dev libpng-dev  # data: gzipped IDX, JPEG and PNG image folders
  openmpi-bin libopenmpi-dev         # run.comm: mpi (libvh_comm_mpi) and the many-process tests
  slurm-wlm                          # srun tests (tools/slurm-local.sh): ~3.5 MB, 12 s; starts no service
  dataset-fashion-mnist              # the main job's data
  clang libclang-rt-dev libomp-dev valgrind  # tools/fuzz.sh (libFuzzer, clang OpenMP), tools/valgrind.sh
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

as_root=()
[ "$(id -u)" -ne 0 ] && as_root=(sudo)
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
