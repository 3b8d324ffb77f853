#!/usr/bin/env bash
# Issue 44 plan: hiding RESOLVE's misses, in one device call.
#   tools/gpu/make-bundle.sh .bundle-gpu            # here
#   tools/gpu/hide-misses-plan.sh .bundle-gpu       # there, from the repo root ($OUT collects the files)
# Steps (each skipped when its variable is 0):
#   TESTS=1   gpu_topk_test (TOP-K against its reference); gpu_prewarm_test; gpu_resolve_test's budget, consumer-block,
#             beside, graph and prepared-config cases; pytest of the serve benchmark (kernels, the top-k,
#             the CPU smoke runs: sweep and curve) and of the CUDA data path (PYTEST: the files)
#   TOPK=1    the top-k's time a call, torch.topk against hisparse.topk, at 1-32 rows of 131,136 scores,
#             normal and half of them zero (serve_bench.time_topk)
#   TOPKB=1   hisparse-bench topk at TOPKB_ROWS rows (7,14,15,29), the launcher's blocks, its scores in
#             L2 and read from HBM after 128 MiB of other data (--l2 warm,cold): what a top-k call
#             costs after an indexer that streamed its keys
#   FETCH=1   hisparse-bench resolve: scattered misses through 2 MiB pages (FETCH_LAYOUT) at batch 8
#             and 128 (FETCH_BATCH), records of FETCH_RECORDS bytes (656,1152; 640: a record of five
#             128-B lines, RESULTS "Scattered reads count lines"), 20% and 100% misses (FETCH_MISS), per RESOLVE
#             budget of blocks (FETCH_BLOCKS), per count of consumer blocks (FETCH_CONSUMERS) and per
#             count of consumer warps a block (FETCH_WARPS; 0: the library's choice)
#   CURVE=1   serve_bench.py's hit-rate curve (HIT_RATES, CONTEXTS) with the overlap variants
#             (OVERLAP: specs of dsv32.Overlap.parse), exact against full HBM at every point; the link
#             measured first. Once per value of CONNECTIONS (CUDA_DEVICE_MAX_CONNECTIONS; "-": unset,
#             the default), into curve.jsonl, or curve-N.jsonl for each N; and within that once per
#             top-k of TOPKS ("torch hisparse": --topk each, into curve[-N]-torch.jsonl and so on)
#   DUMP_SCORES=PREFIX (with CURVE_ARGS="--dump-scores PREFIX", a path outside $OUT: ~15 MB a point)
#             hisparse-bench topk on each dumped point's own scores at 7, 14, 15 and all its rows, warm
#             and cold: the serving top-k's extra 7-12 µs a call are its scores' (bench/RESULTS.md, "How
#             the serving scores' bytes crowd")
#   LOW=1     TPOT at batch 1, 2, 4 (128k), full HBM against hisparse with the overlap asked for
#   DENSITY=1 (item 3) hisparse-bench gather of 656- and 1152-B records over DENSITY_SPAN (8G) of
#             registered host memory, DENSITY_RECORDS of them (16384 65536 262144: 4, 16 and 64 a
#             2 MiB page), random and in address order, on DENSITY_BLOCKS blocks (0,8: one a SM, and
#             the narrow window of stop 25): whether the rate of scattered reads follows how many
#             records a page holds at a fixed span
# Writes under $OUT: summary.txt and one log (and JSON lines) per step.
set -uo pipefail
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # plan_begin BUNDLE; step LIMIT_S NAME CMD...
plan_begin "${1:-}"
if [ "${TESTS:-1}" != 0 ]; then
  step 120 gpu_topk_test "$B/run" gpu_topk_test > "$OUT/gpu_topk_test.log" 2>&1
  tail -3 "$OUT/gpu_topk_test.log" >> "$S"
  step 60 gpu_prewarm_test "$B/run" gpu_prewarm_test > "$OUT/gpu_prewarm_test.log" 2>&1
  tail -3 "$OUT/gpu_prewarm_test.log" >> "$S"
  step 120 gpu_resolve_test "$B/run" gpu_resolve_test \
    --gtest_filter='ResolveGpu.ABudget*:ResolveGpu.FewerConsumer*:ResolveGpu.ConsumerWarps*:ResolveGpu.Beside*:ResolveGpu.EarlyDependents*:ResolveGpu.Prepared*:ResolveGpu.GraphReplay*:ResolveGpu.Programmatic*' \
    > "$OUT/gpu_resolve_test.log" 2>&1
  tail -3 "$OUT/gpu_resolve_test.log" >> "$S"
  # shellcheck disable=SC2086  # PYTEST is a list of files
  step 300 pytest "$PY" -m pytest -q -p no:cacheprovider ${PYTEST:-tests/python/test_serve_bench.py tests/python/test_topk.py tests/python/test_gpu.py} \
    > "$OUT/pytest.log" 2>&1
  tail -3 "$OUT/pytest.log" >> "$S"
fi
if [ "${TOPK:-0}" != 0 ]; then
  step 120 topk "$PY" -c "import sys, json, torch; sys.path.insert(0, 'examples/engine'); import serve_bench
for z in (0.0, 0.5):
    print(json.dumps(dict(kind='topk_us', zeros=z, us=serve_bench.time_topk(torch.device('cuda'), 2048, zeros=z))))" \
    > "$OUT/topk.jsonl" 2> "$OUT/topk.err"
  cat "$OUT/topk.jsonl" >> "$S"
fi
if [ "${TOPKB:-0}" != 0 ]; then
  step 120 topkb "$B/run" hisparse-bench topk --rows "${TOPKB_ROWS:-7,14,15,29}" --blocks 0 --zeros 0,0.5 \
    --l2 warm,cold > "$OUT/topkb.jsonl" 2> "$OUT/topkb.err"
  grep -c '"check":"ok"' "$OUT/topkb.jsonl" >> "$S"
fi
if [ "${FETCH:-1}" != 0 ]; then
  step "${FETCH_LIMIT:-240}" fetch "$B/run" hisparse-bench resolve --pattern scattered \
    --host-layout "${FETCH_LAYOUT:-paged}" --batch "${FETCH_BATCH:-8,128}" --slots 4096 --record-bytes "${FETCH_RECORDS:-656,1152}" \
    --miss "${FETCH_MISS:-0.2,1}" --runs "${FETCH_RUNS:-30}" --max-blocks "${FETCH_BLOCKS:-0,16,32}" \
    --consumer-blocks "${FETCH_CONSUMERS:-0}" --consumer-warps "${FETCH_WARPS:-0}" > "$OUT/fetch.jsonl" 2> "$OUT/fetch.err"
  grep -c '"check":"ok"' "$OUT/fetch.jsonl" >> "$S"
fi
if [ "${CURVE:-1}" != 0 ]; then
  for conn in ${CONNECTIONS:--}; do
    for topk in ${TOPKS:--}; do
      name=curve${conn#-}; [ "$conn" = - ] || name=curve-$conn
      topk_args=(); [ "$topk" = - ] || { name=$name-$topk; topk_args=(--topk "$topk"); }
      echo "== $name (CUDA_DEVICE_MAX_CONNECTIONS ${conn/#-/unset}, top-k ${topk/#-/default})" >> "$S"
      ( [ "$conn" = - ] || export CUDA_DEVICE_MAX_CONNECTIONS=$conn
        # shellcheck disable=SC2086  # CURVE_ARGS is a list of arguments
        step "${CURVE_LIMIT:-420}" "$name" "$PY" examples/engine/serve_bench.py --layers 8 \
          --contexts "${CONTEXTS:-131072,32768}" --host-pool-size 40GiB \
          --hit-rates "${HIT_RATES:-0.4,0.5,0.6,0.7,0.78,0.87,0.95}" --steps "${STEPS:-32}" --overlap "${OVERLAP:-4}" \
          --calibrate-localities "${LOCALITIES:-0,0.5,1,1.5,2,2.5,3,3.5}" --time-budget-s "${CURVE_BUDGET:-380}" \
          "${topk_args[@]}" ${CURVE_ARGS:-} --json "$OUT/$name.jsonl" > "$OUT/$name.log" 2>&1 )
      grep -E '"kind": "(link|calibration)"|^\|.*\| (True|False|[0-9]+\+[0-9]+/[0-9]+) \|$|Error|error' "$OUT/$name.log" | tail -40 >> "$S"
    done
  done
fi
if [ -n "${DUMP_SCORES:-}" ]; then  # with CURVE_ARGS="--dump-scores $DUMP_SCORES" (a prefix outside $OUT)
  for f in "$DUMP_SCORES"-*.f32; do
    [[ $f =~ -([0-9]+)x([0-9]+)-loc[^/]*\.f32$ ]] || continue  # PREFIX-CONTEXT-ROWSxCOLS-locL.f32
    rows=${BASH_REMATCH[1]} cols=${BASH_REMATCH[2]}
    step 120 "topk-scores" "$B/run" hisparse-bench topk --scores "$f" --cols "$cols" \
      --rows "$(printf '%s\n' 7 14 15 "$rows" | awk -v n="$rows" '$1 <= n' | sort -nu | paste -sd,)" --blocks 0 \
      --l2 warm,cold >> "$OUT/topk-scores.jsonl" 2>> "$OUT/topk-scores.err"
    echo "$f" >> "$OUT/topk-scores.files"
  done
fi
if [ "${LOW:-0}" != 0 ]; then
  step 200 low "$PY" examples/engine/serve_bench.py --layers 8 --contexts 131072 --levels 1,2,4 --max-concurrency 4 \
    --slots 4096 --hybrid-slots '' --steps 48 --probe-steps 0 --host-pool-size 16GiB \
    --overlap "${OVERLAP_LOW:-${OVERLAP:-4}}" --json "$OUT/low.jsonl" > "$OUT/low.log" 2>&1
  grep -E '^\| (baseline|hisparse)|exactness|Error' "$OUT/low.log" >> "$S"
fi
if [ "${DENSITY:-0}" != 0 ]; then
  for n in ${DENSITY_RECORDS:-16384 65536 262144}; do
    step 120 "density-$n" "$B/run" hisparse-bench gather --pool register --span "${DENSITY_SPAN:-8G}" --records "$n" \
      --record-bytes 656,1152 --order random,address --method warp --blocks "${DENSITY_BLOCKS:-0,8}" --runs 10 \
      >> "$OUT/density.jsonl" 2>> "$OUT/density.err"
  done
  grep -c '"check":"ok"' "$OUT/density.jsonl" >> "$S"
fi
exit 0
