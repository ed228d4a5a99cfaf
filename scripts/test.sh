#!/usr/bin/env bash
# test.sh: set up, build, check the formatting (scripts/check-format.sh), and run the whole ctest suite (labels unit,
# ops, model, e2e, parallel), then
# scripts/test-sanitizers.sh: unit and ops under ASan + UBSan, and each fuzz target for 20 s (label fuzz).
#   scripts/test.sh [extra ctest arguments, e.g. -L ops]
# Extra arguments go to the main suite's ctest and skip the sanitizer stage; MS_TEST_SANITIZERS=1 runs it anyway,
# MS_TEST_SANITIZERS=0 never.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage says how long it took (CI's budget is 40 minutes on 2 cores).
took() { echo "test.sh: $1 took $((SECONDS - stage_start)) s (total $SECONDS s)"; stage_start=$SECONDS; }
stage_start=$SECONDS
scripts/setup.sh build
took "setup and build"
scripts/check-format.sh  # docs/style.md: one .clang-format, checked here
# Tests share 2 cores with each other's processes: threads that spin while waiting only steal time there.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# One job per core (MS_JOBS overrides): only the tests that run on one OS thread share the cores; every other test
# is RUN_SERIAL and runs alone (tests/CMakeLists.txt).
(cd build && ctest --output-on-failure --timeout 900 --parallel "${MS_JOBS:-$(nproc)}" "$@")
took "the main suite"
if [ "${MS_TEST_SANITIZERS:-$(($# == 0))}" = 1 ]; then
  scripts/test-sanitizers.sh
  took "the sanitizer and fuzz stage"
fi
