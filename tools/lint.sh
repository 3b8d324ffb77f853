#!/usr/bin/env bash
# clang-tidy (.clang-tidy) over the project's own C++ sources, using build/compile_commands.json
# (run tools/build.sh first). Generated protobuf code and CUDA sources are not linted.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/compile_commands.json ]] || { echo "lint: run tools/build.sh first"; exit 2; }
mapfile -t files < <(git ls-files '*.cc' | grep -v -E '^tests/fuzz/')
runner=$(command -v run-clang-tidy || command -v run-clang-tidy-14 || true)
if [[ -n $runner ]]; then
  "$runner" -quiet -p build -j "${HISPARSE_JOBS:-$(nproc)}" "${files[@]/#/$PWD/}" >build/lint.log 2>&1 || {
    grep -E "warning:|error:" build/lint.log | sort -u | head -50
    echo "lint: clang-tidy found problems (full log: build/lint.log)"
    exit 1
  }
else
  for f in "${files[@]}"; do clang-tidy --quiet -p build "$f"; done
fi
echo "lint: ${#files[@]} files clean"
