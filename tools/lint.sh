#!/usr/bin/env bash
# clang-tidy over the project's own C++ sources, using build/compile_commands.json (run
# tools/build.sh first). Generated protobuf code and CUDA sources are not linted.
#   - product code (common, daemon, client, kernels, bench, tools): every check of .clang-tidy;
#   - tests: the checks that find real bugs in test code (below), which cost a third of the full
#     set's time (gtest's and gmock's templates make every check slow there); the full set over
#     the tests was half of CI's lint time. HISPARSE_LINT_TESTS=0 (CI sets it, for time) skips them:
#     test code is still compiled with -Werror by gcc and clang and run under ASan, UBSan and TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/compile_commands.json ]] || { echo "lint: run tools/build.sh first"; exit 2; }
# The tests compile in batches (HISPARSE_UNITY_TESTS): a batch's entry in compile_commands.json
# names the generated file that #includes them. build/lint/compile_commands.json is the same
# database with every batch replaced by one entry per file it includes, under the batch's command.
mkdir -p build/lint
python3 - build/compile_commands.json build/lint/compile_commands.json <<'PY'
import json, re, sys
out = []
for e in json.load(open(sys.argv[1])):
    if "/Unity/unity_" not in e["file"]:
        out.append(e)
        continue
    for src in re.findall(r'^#include "(.+)"$', open(e["file"]).read(), re.M):
        cmd = e["command"].replace(e["file"], src)
        out.append({"directory": e["directory"], "command": cmd, "file": src})
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
mapfile -t product < <(git ls-files '*.cc' | grep -v -E '^tests/')
mapfile -t tests < <(git ls-files 'tests/*.cc' | grep -v -E '^tests/fuzz/')
TEST_CHECKS='-*,bugprone-use-after-move,bugprone-unused-return-value,bugprone-dangling-handle,bugprone-undefined-memory-manipulation,modernize-use-override,misc-unused-using-decls'
runner=$(command -v run-clang-tidy || command -v run-clang-tidy-14 || true)
jobs=${HISPARSE_JOBS:-$(nproc)}
status=0
: > build/lint.log
lint() {  # CHECKS_ARG FILES...
  local checks=$1; shift
  if [[ -n $runner ]]; then
    "$runner" -quiet -p build/lint -j "$jobs" ${checks:+"-checks=$checks"} "${@/#/$PWD/}" >>build/lint.log 2>&1 || status=1
  else
    for f in "$@"; do clang-tidy --quiet -p build/lint ${checks:+"--checks=$checks"} "$f" >>build/lint.log 2>&1 || status=1; done
  fi
}
lint "" "${product[@]}"
if [[ ${HISPARSE_LINT_TESTS:-1} == 0 ]]; then
  tests=()
  TEST_CHECKS="not linted: HISPARSE_LINT_TESTS=0"
else
  lint "$TEST_CHECKS" "${tests[@]}"
fi
if [[ $status -ne 0 ]]; then
  grep -E "warning:|error:" build/lint.log | sort -u | head -50
  echo "lint: clang-tidy found problems (full log: build/lint.log)"
  exit 1
fi
echo "lint: ${#product[@]} product files (every check), ${#tests[@]} test files (${TEST_CHECKS//,/ }) clean"
