#!/usr/bin/env bash
# test.sh: set up, build, and run the whole ctest suite (labels unit, ops, model, e2e).
#   scripts/test.sh [extra ctest arguments, e.g. -L ops]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
# Tests share 2 cores with each other's processes: threads that spin while waiting only steal time there.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ctest --output-on-failure --timeout 900 "$@"
