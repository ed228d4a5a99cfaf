#!/usr/bin/env bash
# demo.sh: set up, build, and train a small GPT on the CPU on a language the program generates itself.
# The log shows the loss falling toward the language's entropy rate and ends with a generated sample.
#   scripts/demo.sh [--set section.key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/mindspeed-train train --config configs/demo.yaml "$@"
