#!/usr/bin/env bash
# GPU plan for issue 4 (GPU arenas shared by the daemon: the cudaIpc fallback, session-open phases,
# RESOLVE on the daemon's arena vs an own one), run on the GPU host with a bundle of the CUDA build:
#   ../shared/tools/gpu-bundle BUNDLE build-cuda/bin/{gpu_two_process_test,gpu_engine,hisparsed,hisparse-bench}
#   tools/gpu/issue4-plan.sh BUNDLE
# (libhisparse.so comes along as a library of gpu_engine / gpu_two_process_test.)
# About 3 to 4 minutes. Writes at most 6 files under $OUT (default ./out): gpu.txt, two_process.log,
# session_open.jsonl, resolve_shared.jsonl, bench_stderr.log, summary.txt.
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HISPARSE_DAEMON_BIN="$B/bin/hisparsed"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
free -g >> "$OUT/gpu.txt"
S="$OUT/summary.txt"
: > "$S"
# shellcheck source=tools/gpu/plan-lib.sh
source "$(dirname "$0")/plan-lib.sh"  # step LIMIT_S NAME CMD...

# 1. The two-process test: every case under gpu.arena_export auto (VMM) and forced cuda_ipc,
#    RESOLVE vs the reference, kill -9 x20 with GPU memory back to baseline, two engines, isolation.
step 200 two_process "$B/bin/gpu_two_process_test" > "$OUT/two_process.log" 2>&1
grep -E '^\[  (PASSED|FAILED|SKIPPED) |kill -9' "$OUT/two_process.log" | tee -a "$S"

# 2. Session open, broken into phases: 1 GiB and 16 GiB arenas, vmm and cuda_ipc, 3 repeats each;
#    then a 64 GiB host pool of 1 GiB memfd segments mapped and cudaHostRegister'ed.
step 150 session_open "$B/bin/hisparse-bench" session-open --modes vmm,cuda_ipc --arena-gib 1,16 --repeats 3 \
  --pool-gib 64 --segment-gib 1 > "$OUT/session_open.jsonl" 2>> "$OUT/bench_stderr.log"

# 3. RESOLVE through the daemon's arena vs the bench's own cudaMalloc'ed arena (same geometry,
#    host pool and state; ABBA-interleaved; medians of 300 runs), both sharing modes.
: > "$OUT/resolve_shared.jsonl"
for mode in vmm cuda_ipc; do
  step 90 "resolve_shared_$mode" "$B/bin/hisparse-bench" resolve-shared --mode "$mode" --batch 64 --slots 4096 \
    --k 2048 --record-bytes 656 --miss 0,0.05,0.2 --runs 300 >> "$OUT/resolve_shared.jsonl" 2>> "$OUT/bench_stderr.log"
done
grep -h '"ratio_shared_to_own"' "$OUT/resolve_shared.jsonl" |
  sed -E 's/.*"mode":"([^"]*)".*"miss_rate":([^,]*).*"shared_median_us":([^,]*),"own_median_us":([^,]*).*"ratio_shared_to_own":([^,]*).*"check":"([^"]*)".*/resolve_shared \1 miss=\2 shared=\3us own=\4us ratio=\5 \6/' |
  tee -a "$S"
exit 0
