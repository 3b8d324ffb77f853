#!/usr/bin/env bash
# RESOLVE before/after plan (issue 20): the kernel's correctness tests, then the same sweeps with a
# previous binary and the new one in alternation, in one device call, so both see the same link.
#   tools/gpu/make-bundle.sh .bundle-gpu                         # here
#   tools/gpu/kernel-variant.sh resolve_multi.cu REV:kernels/resolve_multi.cu \
#     .bundle-gpu/bin/hisparse-bench-before                      # optional: the baseline, here
#   tools/gpu/resolve-plan.sh .bundle-gpu                        # there, from the repo root
# Sweeps (each binary, in the order before, after, before, after; each measures the link first):
#   default  hisparse-bench resolve --runs 100 (150 points: batch 1..128, B 4096/8192, 512/656/1152
#            B, 0..100% consecutive misses, cold L2; no-IO planning and the launch floor per point)
#   warm     --warm-l2 --batch 1,128 --slots 4096,8192 --record-bytes 1152 --miss 0,0.001,0.2
#   scatter  --pattern scattered at 32k and 128k contexts, batch 64/128, 656/1152 B, 20%/100%,
#            contiguous and slab host layouts
#   draft    --draft-tokens 0,1,3 --no-fetch (the multi-query planner against the single kernel)
# SWEEPS="default warm" picks a subset; ROUNDS=1 runs each binary once.
# Writes under $OUT: summary.txt, tests.log and results.tgz, which holds one JSON-lines file (and
# its stderr) per (sweep, binary, round): the device tool returns at most 8 files.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
R=$(mktemp -d)
trap 'rm -rf "$R"' EXIT
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
S="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; } > "$S" 2>&1
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # step LIMIT_S NAME CMD...
T="$OUT/tests.log"
: > "$T"
for t in ${TESTS:-gpu_resolve_test gpu_prefetch_test gpu_two_process_test gpu_resolve_multi_test}; do
  echo "=== $t" >> "$T"
  step 200 "$t" "$B/bin/$t" >> "$T" 2>&1
done
grep -E '^\[  (PASSED|FAILED) |tests? ran' "$T" | tee -a "$S"
bins=(after)
[[ -x $B/bin/hisparse-bench-before ]] && bins=(before after)
scattered="--batch 64,128 --slots 4096 --record-bytes 656,1152 --miss 0.2,1 --pattern scattered --host-layout contiguous,slabs --runs 30"
declare -A args=(
  [default]="--runs 100"
  [warm]="--warm-l2 --batch 1,128 --slots 4096,8192 --record-bytes 1152 --miss 0,0.001,0.2 --runs 100"
  [scatter]="$scattered --context 131072"
  [scatter32k]="$scattered --context 32768"
  [draft]="--draft-tokens 0,1,3 --runs 100 --record-bytes 656 --no-fetch"
)
for round in $(seq 1 "${ROUNDS:-2}"); do
  for sweep in ${SWEEPS:-default warm scatter scatter32k draft}; do
    for bin in "${bins[@]}"; do
      exe=$B/bin/hisparse-bench
      [[ $bin == before ]] && exe=$B/bin/hisparse-bench-before
      # shellcheck disable=SC2086
      step 300 "$sweep $bin $round" "$exe" resolve ${args[$sweep]} > "$R/$sweep-$bin-$round.jsonl" 2> "$R/$sweep-$bin-$round.err"
      grep -c '"check":"FAILED"' "$R/$sweep-$bin-$round.jsonl" | sed "s/^/  failed points: /" >> "$S"
      grep '"kind":"link"' "$R/$sweep-$bin-$round.jsonl" | head -1 >> "$S"
      tar czf "$OUT/results.tgz" -C "$R" .
    done
  done
done
