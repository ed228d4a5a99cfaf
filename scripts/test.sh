#!/usr/bin/env bash
# test.sh: set up, build, and run the whole ctest suite (labels unit, ops, model, e2e).
#   scripts/test.sh [extra ctest arguments, e.g. -L ops]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
ctest --output-on-failure --timeout 900 "$@"
