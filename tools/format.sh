#!/usr/bin/env bash
# Formats every C/C++/CUDA source with clang-format (.clang-format), or with --check reports the
# files that would change and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.hpp' '*.cc' '*.cu' '*.cuh' '*.c' | grep -v '^tests/fuzz/corpus/')
if [[ ${1:-} == --check ]]; then
  bad=0
  for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then echo "format: $f needs tools/format.sh"; bad=1; fi
  done
  [[ $bad -eq 0 ]] && echo "format: ${#files[@]} files clean"
  exit $bad
fi
clang-format -i "${files[@]}"
