#!/usr/bin/env bash
# Issue 38's GPU plan: the engines' adapters and RESOLVE's padding (rule 10), in one device call.
# Built here, run there (the GPU host has no gRPC):
#   tools/gpu/make-bundle.sh .bundle-gpu                       # here: CUDA build, stripped
#   tools/gpu/kernel-variant.sh resolve_multi.cu REV:kernels/resolve_multi.cu \
#     .bundle-gpu/bin/hisparse-bench-before-multi              # optional: a baseline, here
#   tools/gpu/engines-plan.sh .bundle-gpu                      # there, from the repo root
# Steps, most important first (a run cut short keeps what it did): the link (hisparse-bench's own
# measurement); gpu_resolve_test and gpu_resolve_multi_test (rule 10 held bit-equal to the
# reference); pytest tests/python (the adapters' stand-in tests, their CUDA-graph and GPU cases);
# examples/engine/run_engine.py through the SGLang adapter (plain with the overlap scheduler, then
# MTP verify rounds) and through the vLLM adapter (its index group's physical top-k over the arena),
# bit-exact against the full pool; the multi-query planner (--draft-tokens 1,3 --no-fetch) of each
# hisparse-bench-* baseline in the bundle against the build's own, two rounds in alternation.
# Writes under $OUT: summary.txt, gpu_tests.log, pytest.log, adapters.log, bench.tgz.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HISPARSE_DAEMON_BIN="$B/bin/hisparsed" HISPARSE_LIB="$B/bin/libhisparse.so" PYTHONUNBUFFERED=1
PY=${PY:-python3}
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } > "$S" 2>&1
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # step LIMIT_S NAME CMD...
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
step 60 link "$B/bin/hisparse-bench" resolve --batch 1 --slots 4096 --k 2048 --record-bytes 1152 --miss 0.2 \
  --runs 20 > "$R/link.jsonl" 2>&1
grep '"kind":"link"' "$R/link.jsonl" | tee -a "$S"
G="$OUT/gpu_tests.log"
: > "$G"
for t in ${TESTS:-gpu_resolve_test gpu_resolve_multi_test}; do
  echo "=== $t" >> "$G"
  (cd "$B/bin" && step 240 "$t" "./$t") >> "$G" 2>&1
done
grep -E '^=== |^\[  (PASSED|FAILED) |tests? ran|rc=' "$G" | tee -a "$S"
step 300 pytest "$PY" -m pytest -q -p no:cacheprovider tests/python > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log" | tee -a "$S"
A="$OUT/adapters.log"
: > "$A"
for args in "--adapter sglang --configs 8x16384 --steps 100 --slots-factor 1,2 --records bf16,fp8" \
  "--adapter sglang --draft-tokens 1,3 --slots-factor 0 --configs 8x16384 --steps 60 --records bf16,fp8" \
  "--adapter vllm --configs 4x16384,8x4096 --steps 40 --slots-factor 1,2 --records bf16,fp8"; do
  echo "=== run_engine.py $args" >> "$A"
  # shellcheck disable=SC2086
  step 240 "engine $args" "$PY" examples/engine/run_engine.py --device cuda --k 2048 $args >> "$A" 2>&1
done
grep -E '^=== |EXACT|MISMATCH|GAINED|^link|Error|rc=' "$A" | tee -a "$S"
for round in 1 2; do
  for exe in "$B"/bin/hisparse-bench-* "$B/bin/hisparse-bench"; do
    [[ -x $exe ]] || continue
    name=$(basename "$exe")
    step 100 "multi $name $round" "$exe" resolve --draft-tokens 1,3 --no-fetch --batch 1,32,128 --record-bytes 656 \
      --runs 50 > "$R/multi-$name-$round.jsonl" 2>&1
  done
done
tar czf "$OUT/bench.tgz" -C "$R" .
exit 0
