#!/usr/bin/env bash
# check-format.sh: every C++ / CUDA source of the working tree -- tracked, or untracked and not ignored, so that a new
# file is checked before it is `git add`ed -- is as .clang-format says (docs/style.md: one .clang-format, checked
# in CI). Uses clang-format 14 (Debian 12's, which scripts/setup.sh installs): another major version formats a few
# constructs differently, so with none of version 14 the check says so and is skipped rather than failing on them.
#   scripts/check-format.sh          report the files that differ (exit 1 when any does)
#   scripts/check-format.sh --fix    reformat them in place
set -euo pipefail
cd "$(dirname "$0")/.."
tool=""
for t in clang-format-14 clang-format; do
  if command -v "$t" >/dev/null 2>&1 && "$t" --version | grep -q 'version 14\.'; then tool=$t; break; fi
done
if [ -z "$tool" ]; then
  echo "check-format: no clang-format 14 found (scripts/setup.sh installs it); format check skipped" >&2
  exit 0
fi
# --cached: the tracked files; --others --exclude-standard: the untracked ones .gitignore does not exclude. A tracked
# file deleted in the working tree is left out.
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.h' '*.cu' '*.cuh' |
  while IFS= read -r f; do if [ -f "$f" ]; then printf '%s\n' "$f"; fi; done)
if [ "${1:-}" = --fix ]; then
  "$tool" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run "$f" 2>&1 | grep -q 'warning:' && bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'check-format: %s is not formatted as .clang-format says\n' "${bad[@]}" >&2
  echo "---> HINT: run scripts/check-format.sh --fix (clang-format 14), review, commit" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
