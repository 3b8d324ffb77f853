#!/usr/bin/env bash
# Issue 16 plan: the DeepSeek-V3.2-class decode node, full HBM against hisparse, in one device call.
#   tools/gpu/make-bundle.sh .bundle-gpu      # here
#   tools/gpu/serve-plan.sh .bundle-gpu       # there, from the repo root ($OUT collects the files)
# Steps: the kernel cross-checks (pytest tests/python/test_serve_bench.py), the sweep at 128k and 32k
# (fp8 records; link measured by the benchmark itself), a bf16-record exactness run.
# Writes under $OUT: summary.txt, pytest.log, serve.log, serve.jsonl, serve.png, ctl_watch.json, bf16.log.
set -uo pipefail
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # plan_begin BUNDLE; step LIMIT_S NAME CMD...
plan_begin "${1:-}"
step 120 pytest "$PY" -m pytest -q -p no:cacheprovider tests/python/test_serve_bench.py > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log" >> "$S"
step "${SERVE_LIMIT:-380}" serve "$PY" examples/engine/serve_bench.py --layers "${LAYERS:-8}" \
  --contexts "${CONTEXTS:-131072,32768}" --host-pool-size 32GiB --time-budget-s "${SERVE_BUDGET:-330}" \
  ${SERVE_ARGS:-} --json "$OUT/serve.jsonl" --plot "$OUT/serve.png" --ctl-watch "$OUT/ctl_watch.json" > "$OUT/serve.log" 2>&1
grep -E '"kind": "(link|exactness|stop)"|peak tokens|Error|error' "$OUT/serve.log" | tail -20 >> "$S"
step 90 bf16 "$PY" examples/engine/serve_bench.py --layers 4 --records bf16 --contexts 32768 --levels 4 \
  --modes baseline,hisparse --steps 17 --probe-steps 0 --host-pool-size 4GiB > "$OUT/bf16.log" 2>&1
grep -E '"kind": "exactness"|Error' "$OUT/bf16.log" >> "$S"
exit 0
