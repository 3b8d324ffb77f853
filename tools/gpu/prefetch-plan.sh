#!/usr/bin/env bash
# GPU plan for exact layer-wise prefetch (shared indexers), run on the GPU host from the repo root
# with a bundle built here (tools/gpu/README: gpu-bundle of the CUDA build):
#   tools/gpu/prefetch-plan.sh BUNDLE_DIR
# Bundle: gpu_prefetch_test hisparsed libhisparse.so (copied into bin/).
# Writes logs and JSON lines under $OUT (default ./out).
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HISPARSE_DAEMON_BIN="$B/bin/hisparsed" HISPARSE_LIB="$B/bin/libhisparse.so"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
step() { echo "=== $*"; local t=$SECONDS; "$@"; echo "=== rc=$? in $((SECONDS - t)) s: $1"; }
step "$B/bin/gpu_prefetch_test" > "$OUT/gpu_prefetch_test.log" 2>&1; tail -4 "$OUT/gpu_prefetch_test.log"
step python3 -m pytest -q -p no:cacheprovider tests/python > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
step python3 examples/engine/prefetch_bench.py --miss-rates 0.05,0.13,0.3 --batches 32,128 \
  --json "$OUT/prefetch.jsonl" > "$OUT/prefetch.log" 2>&1
grep '"point"\|"link"' "$OUT/prefetch.log"; tail -3 "$OUT/prefetch.log"
step python3 examples/engine/prefetch_bench.py --miss-rates 0.13 --batches 64 --heads 64 --mlp-hidden 8192 \
  --json "$OUT/prefetch_heavy.jsonl" > "$OUT/prefetch_heavy.log" 2>&1
grep '"point"' "$OUT/prefetch_heavy.log"; tail -2 "$OUT/prefetch_heavy.log"
# How many thread blocks the copies take (default an eighth of the SMs) against the overlap.
for blocks in 4 33 132; do
  export HISPARSE_PREFETCH_BLOCKS=$blocks
  step python3 examples/engine/prefetch_bench.py --miss-rates 0.13 --batches 128 \
    --json "$OUT/prefetch_blocks_$blocks.jsonl" > "$OUT/prefetch_blocks_$blocks.log" 2>&1
  grep '"point"' "$OUT/prefetch_blocks_$blocks.log" | sed "s/^/blocks=$blocks /"
done
unset HISPARSE_PREFETCH_BLOCKS
