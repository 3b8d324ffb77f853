#!/usr/bin/env bash
# Packs what the GPU plans run into one folder that travels to the GPU host (`carry` it; it must be
# ignored by git, e.g. .bundle-gpu, and stay under the 64 MiB carry limit): the CUDA build's GPU
# tests, hisparsed, hisparse-keeper, hisparse-bench, the restart tests and libhisparse.so, stripped of debug info, with the shared
# libraries a bare CUDA host lacks (../shared/tools/gpu-bundle).
#   tools/gpu/make-bundle.sh BUNDLE_DIR [BUILD_DIR]     (BUILD_DIR defaults to build)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?bundle dir}
build=${2:-build}
exes=()
for e in gpu_resolve_test gpu_topk_test gpu_prewarm_test gpu_prefetch_test gpu_two_process_test gpu_store_test gpu_resolve_multi_test gpu_arena_session_test gpu_park_share_test gpu_tp_group_test gpu_engine hisparsed hisparse-import-worker hisparse-keeper hisparse-bench hisparse-ctl daemon_restart_test session_journal_test hisparse-durable-engine; do
  exes+=("$build/bin/$e")
done
../shared/tools/gpu-bundle "$out" "${exes[@]}"
cp -L "$build/lib/libhisparse.so" "$out/bin/libhisparse.so"
strip --strip-debug "$out"/bin/* "$out"/lib/* 2>/dev/null || true
du -sh "$out"
