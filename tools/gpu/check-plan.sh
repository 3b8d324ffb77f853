#!/usr/bin/env bash
# GPU regression plan: every GPU test, the Python GPU tests and the benchmarks whose paths a change
# touched, in one device call. Built here, run there (the GPU host has no gRPC):
#   tools/gpu/make-bundle.sh .bundle-gpu        # here: CUDA build, stripped, libhisparse beside
#   tools/gpu/check-plan.sh .bundle-gpu         # there, from the repo root ($OUT collects logs)
# Steps, most important first (a run cut short by the device's time keeps what it did): link
# bandwidth (hisparse-bench resolve's own measurement, one small point); gpu_resolve_test,
# gpu_prefetch_test, gpu_two_process_test, gpu_store_test, gpu_resolve_multi_test,
# gpu_arena_session_test, gpu_park_share_test, gpu_tp_group_test; pytest tests/python (GPU cases included); examples/engine/run_engine.py
# with speculative decoding (1 and 3 drafts, bf16 and fp8, exactness) and through the SGLang adapter
# (--adapter sglang, plain and MTP); hisparse-bench resolve
# --draft-tokens (multi-query RESOLVE against n+1 single-query launches, with fresh misses and the
# planning alone); hisparse-bench resolve over paged host memory against one contiguous run;
# hisparse-bench decode at a short configuration (capacity, matched-batch exactness);
# hisparse-bench serve at a short configuration (128k, batch 1-4 and the peak, every mode,
# exactness). About 7 minutes.
# Writes under $OUT (9 files, what the device tool returns): summary.txt (the GPU first),
# bench.log (the link, then the RESOLVE benchmarks), gpu_tests.log, pytest.log, decode.log,
# serve.log, serve.jsonl, speculative.log, adapter.log.
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
BL="$OUT/bench.log"
step 60 link "$B/bin/hisparse-bench" resolve --batch 1 --slots 4096 --k 2048 --record-bytes 1152 --miss 0.2 \
  --runs 20 > "$BL" 2>&1
grep '"kind":"link"' "$BL" | tee -a "$S"
G="$OUT/gpu_tests.log"
: > "$G"
for t in gpu_resolve_test gpu_prefetch_test gpu_two_process_test gpu_store_test gpu_resolve_multi_test gpu_arena_session_test \
  gpu_park_share_test gpu_tp_group_test; do
  echo "=== $t" >> "$G"
  step 200 "$t" "$B/bin/$t" >> "$G" 2>&1
done
grep -E '^=== |^\[  (PASSED|FAILED) |tests? ran|SKIPPED' "$G" | tee -a "$S"
step 240 pytest "$PY" -m pytest -q -p no:cacheprovider tests/python > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log" | tee -a "$S"
step 200 speculative "$PY" examples/engine/run_engine.py --draft-tokens 1,3 --slots-factor 0 --configs 4x32768 \
  --k 2048 --steps 40 --records bf16,fp8 > "$OUT/speculative.log" 2>&1
grep -E '^link|^exactness|^speculative|^engine' "$OUT/speculative.log" | tee -a "$S"
# The SGLang adapter driven as SGLang's scheduler and model runner drive it (plain, then MTP verify
# rounds), bit-exact against the full pool.
for args in "--slots-factor 1 --records bf16,fp8" "--draft-tokens 1,3 --slots-factor 0 --records bf16"; do
  step 200 "adapter $args" "$PY" examples/engine/run_engine.py --adapter sglang --configs 4x32768 --k 2048 \
    --steps 40 $args >> "$OUT/adapter.log" 2>&1
done
grep -E '^exactness|^engine|MISMATCH' "$OUT/adapter.log" | tee -a "$S"
# The RESOLVE sweeps (multi-query and paged host memory) when the kernels changed: PLAN_SWEEPS=1.
# Otherwise the resolve bench's smoke (every host layout and pattern, checked).
if [[ ${PLAN_SWEEPS:-0} == 1 ]]; then
  # Multi-query RESOLVE: lists overlapping 80% (each list brings 20% never-seen positions), then
  # the same steps planned without moving records (--no-fetch: the planning alone), 656 and 1152 B.
  for args in "--record-bytes 656" "--record-bytes 656 --no-fetch"; do
    echo "=== resolve --draft-tokens 0,1,3 $args" >> "$BL"
    step 120 "resolve-draft $args" "$B/bin/hisparse-bench" resolve --draft-tokens 0,1,3 --runs 100 $args >> "$BL" 2>&1
  done
  grep -E '^ +[0-9]+ +[0-9]+ ' "$BL" | tee -a "$S"
  # Paged host memory against one contiguous run (issue 17): pages scattered at random over a
  # 64 GiB pinned pool, consecutive and scattered misses of a 128k context, 20% and 100%.
  echo "=== resolve paged vs contiguous" >> "$BL"
  step 200 "resolve-paged" "$B/bin/hisparse-bench" resolve --batch 1,10,64,128 --slots 4096 --record-bytes 656,1152 \
    --miss 0.2,1 --pattern consecutive,scattered --host-layout contiguous,paged --page-size 2M,16M,64M --pool 64G \
    --runs 50 >> "$BL" 2>&1
else
  echo "=== resolve --smoke" >> "$BL"
  step 60 resolve-smoke "$B/bin/hisparse-bench" resolve --smoke >> "$BL" 2>&1
  grep -c '"check":"ok"' "$BL" | sed 's/^/resolve smoke points ok: /' | tee -a "$S"
fi
step 200 decode "$PY" examples/engine/decode_bench.py --hbm-budget 8GiB --host-pool-size 12GiB \
  --host-pool-segment-size 1GiB --contexts 32768 --k 2048 --slots 4096 --matched-slots 4096 --layers 4 \
  --records bf16 --steps 12 --probe-steps 4 --time-budget-s 150 > "$OUT/decode.log" 2>&1
grep -E 'link|EXACT|MISMATCH|ratio|tokens/s' "$OUT/decode.log" | tail -12 | tee -a "$S"
export HISPARSE_CTL_BIN="$B/bin/hisparse-ctl"
step 200 serve "$PY" examples/engine/serve_bench.py --layers 8 --contexts 131072 --levels 1,2,4 --slots 4096 \
  --hybrid-slots 4096 --steps 32 --probe-steps 0 --host-pool-size 24GiB --json "$OUT/serve.jsonl" > "$OUT/serve.log" 2>&1
grep -E '"kind": "link"|"exact": false|peak tokens|Error' "$OUT/serve.log" | tee -a "$S"
echo "serve exactness: $(grep -c '"exact": true' "$OUT/serve.log") exact, $(grep -c '"exact": false' "$OUT/serve.log") not" | tee -a "$S"
exit 0
