#!/usr/bin/env bash
# setup.sh: install the Debian packages mindspeed-train needs (idempotent, apt only) and build it with CMake.
#   scripts/setup.sh [build-dir]        (default: build)
# Environment: MS_ENABLE_CUDA=AUTO|ON|OFF (default AUTO), MS_BUILD_TYPE (default Release), MS_JOBS (default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

packages=(build-essential cmake ninja-build pkg-config
          libyaml-cpp-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          libopenblas-dev libopenmpi-dev openmpi-bin libgtest-dev libpng-dev libjpeg62-turbo-dev
          python3 python3-numpy python3-torch libjemalloc2
          clang libclang-rt-dev libomp-dev  # scripts/test-sanitizers.sh: libFuzzer, sanitizer runtimes, OpenMP
          clang-format                      # scripts/check-format.sh (Debian 12's is version 14)
          munge slurmctld slurmd slurm-client)  # tests/slurm: a single-node Slurm the test starts
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B "$build_dir" -G Ninja \
  -DCMAKE_BUILD_TYPE="${MS_BUILD_TYPE:-Release}" \
  -DMS_ENABLE_CUDA="${MS_ENABLE_CUDA:-AUTO}" >/dev/null
cmake --build "$build_dir" -j "${MS_JOBS:-$(nproc)}"
echo "setup: built $build_dir/mindspeed-train"
