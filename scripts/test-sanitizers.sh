#!/usr/bin/env bash
# test-sanitizers.sh: the unit and op tests under AddressSanitizer + UndefinedBehaviorSanitizer, then a short run of
# every fuzz target (fuzz/), from one build folder; scripts/test.sh runs it after the main suite.
#   scripts/test-sanitizers.sh [build-dir]        (default: build-asan)
# Environment: MS_FUZZ_SECONDS per fuzz target (default 20), MS_JOBS (default nproc).
#
# With clang++ (scripts/setup.sh installs it) the folder is a Clang build that also holds the libFuzzer targets,
# linked against the same sanitized ms_engine as the tests, so the engine compiles once for both; without Clang
# it is a build with the default compiler and the fuzz stage is skipped (said on stderr). -O1 -g: ASan's advice
# (readable stacks, a fraction of -O0's run time); no -march=native, CUDA off (the kernels still run in test_ops on
# the CPU emulation). Only test_unit, test_ops and the fuzz targets are built.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-asan}

fuzz=OFF
compiler=()
if command -v clang++ >/dev/null 2>&1; then
  fuzz=ON
  compiler=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang)  # one runtime: C targets (tests' fake NVML) too
else
  echo "test-sanitizers: no clang++, so no fuzz targets (scripts/setup.sh installs clang)" >&2
fi
cmake -S . -B "$build_dir" -G Ninja "${compiler[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DMS_SANITIZE=address,undefined -DMS_ENABLE_CUDA=OFF \
  -DMS_BUILD_FUZZERS="$fuzz" -DMS_FUZZ_SECONDS="${MS_FUZZ_SECONDS:-20}" >/dev/null
targets=(test_unit test_ops)
[ "$fuzz" = ON ] && targets+=(fuzzers)
cmake --build "$build_dir" -j "${MS_JOBS:-$(nproc)}" --target "${targets[@]}"
echo "test-sanitizers: configured and built in $SECONDS s"

# Every report is fatal (-fno-sanitize-recover=all, CMakeLists.txt); UBSan also prints the stack. LeakSanitizer
# is on, and needs no suppressions: OpenBLAS and OpenMP leave nothing it reports. No check is exempted anywhere.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
labels='^(unit|ops)$'
[ "$fuzz" = ON ] && labels='^(unit|ops|fuzz)$'
# As in scripts/test.sh, one job per core: the fuzz targets and the emulated CUDA kernels (one OS thread each) run
# two at a time on 2 cores, every other test alone.
ctest --test-dir "$build_dir" --output-on-failure --timeout 900 --parallel "${MS_JOBS:-$(nproc)}" -L "$labels"
