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
# Batches (CMake's unity build): a batch's entry in compile_commands.json names the generated file
# that #includes its sources. The tests are always batched (HISPARSE_UNITY_TESTS), product code
# when HISPARSE_UNITY_BUILD is on (CI: tools/build.sh). build/lint/compile_commands.json is the
# build's database with every test batch replaced by one entry per file it includes (the tests'
# checks are run file by file); a product batch stays one entry, linted whole: its headers are
# parsed once for its files instead of once per file, which is half of what clang-tidy's time
# was (2026-12-02: 3.9 of 7.7 s a file). Warnings in a batch's own files are reported as in the
# files themselves (the header filter below names them). Checked against the file-by-file lint
# with a far broader set of checks (bugprone, performance, misc, modernize, google: 544
# warnings in the product code): the batches found every one of them, but for two checks that
# .clang-tidy does not enable, and misc-unused-using-decls, which looks at the main file only, so
# finds nothing in a batch. That check and bugprone-suspicious-include (a batch includes .cc files
# by design) therefore run only where product code is not batched: the default local build.
# build/lint/product.txt lists what the product lint reads: each product file the build compiles
# alone, and each product batch.
mkdir -p build/lint
git ls-files '*.cc' | grep -v -E '^tests/' > build/lint/product-sources.txt
python3 - build/compile_commands.json build/lint/compile_commands.json build/lint/product-sources.txt \
    build/lint/product.txt "$PWD" <<'PY'
import json, os, re, sys
db, out_db, sources_txt, product_txt, root = sys.argv[1:6]
product_sources = {os.path.join(root, f) for f in open(sources_txt).read().split()}
out, lint = [], []
for e in json.load(open(db)):
    f = e["file"]
    if "/Unity/unity_" not in f:
        out.append(e)
        if f in product_sources:
            lint.append(f)
        continue
    srcs = re.findall(r'^#include "(.+)"$', open(f).read(), re.M)
    if all(src in product_sources for src in srcs):
        out.append(e)
        lint.append(f)
        continue
    for src in srcs:
        out.append({"directory": e["directory"], "command": e["command"].replace(f, src), "file": src})
json.dump(out, open(out_db, "w"), indent=1)
open(product_txt, "w").write("".join(sorted(set(f + "\n" for f in lint))))
covered = {f for f in lint if "/Unity/unity_" not in f}
for f in lint:
    if "/Unity/unity_" in f:
        covered.update(re.findall(r'^#include "(.+)"$', open(f).read(), re.M))
open(os.path.join(os.path.dirname(out_db), "product-count.txt"), "w").write(str(len(covered)))
PY
mapfile -t product < build/lint/product.txt
mapfile -t tests < <(git ls-files 'tests/*.cc' | grep -v -E '^tests/fuzz/')
# .clang-tidy's header filter (the public headers), and the product .cc files a batch includes.
PRODUCT_FILTER=".*/(common|daemon|keeper|client|kernels|bench)/include/hisparse/.*|^$PWD/(common|daemon|keeper|client|kernels|bench|tools|import_worker)/.*\.cc$"
TEST_CHECKS='-*,bugprone-use-after-move,bugprone-unused-return-value,bugprone-dangling-handle,bugprone-undefined-memory-manipulation,modernize-use-override,misc-unused-using-decls'
runner=$(command -v run-clang-tidy || command -v run-clang-tidy-14 || true)
jobs=${HISPARSE_JOBS:-$(nproc)}
status=0
: > build/lint.log
lint() {  # CHECKS_ARG HEADER_FILTER_ARG FILES... (absolute paths)
  local checks=$1 filter=$2; shift 2
  if [[ -n $runner ]]; then
    # run-clang-tidy reads its file arguments as regular expressions.
    local exact=()
    for f in "$@"; do exact+=("^$(sed 's/[.+^$]/\\&/g' <<<"$f")\$"); done
    "$runner" -quiet -p build/lint -j "$jobs" ${checks:+"-checks=$checks"} ${filter:+"-header-filter=$filter"} \
      "${exact[@]}" >>build/lint.log 2>&1 || status=1
  else
    for f in "$@"; do
      clang-tidy --quiet -p build/lint ${checks:+"--checks=$checks"} ${filter:+"--header-filter=$filter"} "$f" \
        >>build/lint.log 2>&1 || status=1
    done
  fi
}
singles=() batches=()
for f in "${product[@]}"; do
  if [[ $f == */Unity/unity_* ]]; then batches+=("$f"); else singles+=("$f"); fi
done
[[ ${#singles[@]} -eq 0 ]] || lint "" "$PRODUCT_FILTER" "${singles[@]}"
[[ ${#batches[@]} -eq 0 ]] || lint "-bugprone-suspicious-include,-misc-unused-using-decls" "$PRODUCT_FILTER" "${batches[@]}"
if [[ ${HISPARSE_LINT_TESTS:-1} == 0 ]]; then
  tests=()
  TEST_CHECKS="not linted: HISPARSE_LINT_TESTS=0"
else
  lint "$TEST_CHECKS" "" "${tests[@]/#/$PWD/}"
fi
if [[ $status -ne 0 ]]; then
  grep -E "warning:|error:" build/lint.log | sort -u | head -50
  echo "lint: clang-tidy found problems (full log: build/lint.log)"
  exit 1
fi
echo "lint: $(cat build/lint/product-count.txt) product files in ${#product[@]} runs (every check), ${#tests[@]} test files (${TEST_CHECKS//,/ }) clean"
