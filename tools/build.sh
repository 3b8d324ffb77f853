#!/usr/bin/env bash
# Configures and builds hisparse into build/ (executables in build/bin). CUDA kernels build for
# sm_90 when nvcc is found (/usr/local/cuda), and are skipped otherwise.
#   tools/build.sh [TARGET...]
# HISPARSE_DEBUG_INFO=0 builds the same optimised code without debug info (-O2 -DNDEBUG, no -g):
# CI sets it, since debug info is about a third of the compile time and no CI step reads it.
# HISPARSE_UNITY_BUILD=1 compiles each target's C++ sources in batches (CMake's unity build; CUDA
# sources stay one object each): CI sets it, where it took the product code's compile from 425 to
# 192 CPU-seconds (2026-12-02, 2-core VM). Off by default: an edit then recompiles one file, not
# its batch of up to 16.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${HISPARSE_JOBS:-$(nproc)}
opt="-O2 -g -DNDEBUG"  # CMake's RelWithDebInfo, set each time so that the cache follows the variable
[[ ${HISPARSE_DEBUG_INFO:-1} == 0 ]] && opt="-O2 -DNDEBUG"
unity=OFF
[[ ${HISPARSE_UNITY_BUILD:-0} == 1 ]] && unity=ON
flags=()
for lang in C CXX CUDA; do flags+=("-DCMAKE_${lang}_FLAGS_RELWITHDEBINFO=$opt"); done
cmake -S . -B build -G Ninja -DHISPARSE_WERROR=ON -DHISPARSE_UNITY_BUILD=$unity "${flags[@]}" >/dev/null
cmake --build build -j"$jobs" ${1:+--target "$@"}
